#include "common/kv/geometry.h"

#include "absl/strings/str_cat.h"
#include "common/engine/kv_cache.h"

namespace tandem::kv {

tandem::v1::KvDtype KvDtypeToProto(kernels::KvDtype dtype) {
  switch (dtype) {
    case kernels::KvDtype::kF32:
      return tandem::v1::KV_DTYPE_F32;
    case kernels::KvDtype::kBf16:
      return tandem::v1::KV_DTYPE_BF16;
    case kernels::KvDtype::kInt8:
      return tandem::v1::KV_DTYPE_INT8;
  }
  return tandem::v1::KV_DTYPE_UNSPECIFIED;
}

tandem::v1::KvGeometry MakeKvGeometry(const model::ModelConfig& config, int block_size,
                                      kernels::KvDtype dtype, bool window_rings) {
  tandem::v1::KvGeometry geometry;
  const model::ModelConfig::KvShape shape = config.kv_shape();
  const engine::KvCacheConfig kv = engine::KvCacheConfigFor(
      config, block_size, /*num_blocks=*/1, dtype, /*max_sequences=*/1, window_rings);
  geometry.set_num_layers(kv.num_layers);
  geometry.set_state_bytes(kv.state_bytes);
  geometry.set_num_kv_heads(shape.heads);
  geometry.set_head_dim(shape.head_dim);
  geometry.set_keys_only(shape.keys_only);
  geometry.set_dtype(KvDtypeToProto(dtype));
  geometry.set_block_size(block_size);
  geometry.set_rope_theta(config.rope_theta);
  geometry.set_max_position_embeddings(static_cast<int32_t>(config.max_position_embeddings));
  return geometry;
}

absl::Status CheckCompatible(const tandem::v1::KvGeometry& ours,
                             const tandem::v1::KvGeometry& theirs) {
  auto mismatch = [](absl::string_view field, auto a, auto b) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV geometry mismatch in ", field, ": this instance has ", a, ", the peer has ", b));
  };
  if (ours.num_layers() != theirs.num_layers()) {
    return mismatch("num_layers", ours.num_layers(), theirs.num_layers());
  }
  if (ours.num_kv_heads() != theirs.num_kv_heads()) {
    return mismatch("num_kv_heads", ours.num_kv_heads(), theirs.num_kv_heads());
  }
  if (ours.head_dim() != theirs.head_dim()) {
    return mismatch("head_dim", ours.head_dim(), theirs.head_dim());
  }
  if (ours.keys_only() != theirs.keys_only()) {
    return mismatch("keys_only", ours.keys_only(), theirs.keys_only());
  }
  if (ours.dtype() != theirs.dtype()) {
    return mismatch("dtype", tandem::v1::KvDtype_Name(ours.dtype()),
                    tandem::v1::KvDtype_Name(theirs.dtype()));
  }
  if (ours.block_size() != theirs.block_size()) {
    return mismatch("block_size", ours.block_size(), theirs.block_size());
  }
  if (ours.rope_theta() != theirs.rope_theta()) {
    return mismatch("rope_theta", ours.rope_theta(), theirs.rope_theta());
  }
  if (ours.state_bytes() != theirs.state_bytes()) {
    return mismatch("state_bytes", ours.state_bytes(), theirs.state_bytes());
  }
  if (ours.max_position_embeddings() != theirs.max_position_embeddings()) {
    return mismatch("max_position_embeddings", ours.max_position_embeddings(),
                    theirs.max_position_embeddings());
  }
  return absl::OkStatus();
}

absl::StatusOr<InstanceModel> LoadInstanceModel(const model::ModelDir& dir, int block_size,
                                                kernels::KvDtype dtype, bool window_rings) {
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block size ", block_size, " must be in [1, 1024]"));
  }
  InstanceModel out;
  out.config = dir.config();
  out.name = dir.name();
  out.geometry = MakeKvGeometry(out.config, block_size, dtype, window_rings);
  return out;
}

}  // namespace tandem::kv
