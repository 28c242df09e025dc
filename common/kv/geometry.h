// KV-cache geometry: what a prefill and a decode instance must agree on to exchange KV
// blocks. Only attention and cache layout count: expert pruning does not change the cache,
// so a pruned decoder pairs with a full prefill.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kernels/kv_format.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kv {

// The geometry of the pool engine::KvCacheConfigFor makes for `config` (its paged layers and
// the bytes of a sequence's state slot: recurrent states and window rings where
// `window_rings`).
tandem::v1::KvGeometry MakeKvGeometry(const model::ModelConfig& config, int block_size,
                                      kernels::KvDtype dtype, bool window_rings = true);
// The wire name of a pool's dtype.
tandem::v1::KvDtype KvDtypeToProto(kernels::KvDtype dtype);

// OK when `ours` and `theirs` can exchange blocks; otherwise FAILED_PRECONDITION naming the
// first field that differs and both values.
absl::Status CheckCompatible(const tandem::v1::KvGeometry& ours,
                             const tandem::v1::KvGeometry& theirs);

// What a prefill or decode instance serves: its model's name (the directory's), config, and
// the KV geometry it exchanges.
struct InstanceModel {
  std::string name;
  model::ModelConfig config;
  tandem::v1::KvGeometry geometry;
};

// `dir`'s name and config and the geometry of a pool storing `dtype`; INVALID_ARGUMENT for a
// bad block size.
absl::StatusOr<InstanceModel> LoadInstanceModel(const model::ModelDir& dir, int block_size,
                                                kernels::KvDtype dtype = kernels::KvDtype::kF32,
                                                bool window_rings = true);

}  // namespace tandem::kv
