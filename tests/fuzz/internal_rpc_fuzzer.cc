// What a peer can send the internal APIs, as bytes on the wire: Reserve, Decode, Release and
// Prefill requests (and the KV target inside), parsed as protobuf does and run through the
// checks the services run before any work (CheckPrefillRequest, SamplingFromProto, the KV
// geometry check). Nothing crashes, and a Prefill request that passes has a prompt the model
// and the target can take.
// Input: one byte choosing the message, then its serialized bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/kv/geometry.h"
#include "common/kv/transfer.h"
#include "services/common/serving.h"
#include "services/prefill/prefill_service.h"
#include "tandem/v1/decode.pb.h"
#include "tandem/v1/prefill.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/testing/model_dir.h"

namespace {

struct Model {
  tandem::kv::InstanceModel instance;
};

const Model& TinyModel() {
  static const Model* model = [] {
    auto loaded = tandem::kv::LoadInstanceModel(
        *tandem::testing::OpenModelDir(std::string(TANDEM_SOURCE_DIR) + "/models/tiny-moe"),
        /*block_size=*/16);
    FUZZ_CHECK(loaded.ok());
    return new Model{*std::move(loaded)};
  }();
  return *model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Model& m = TinyModel();
  const int vocab = static_cast<int>(m.instance.config.vocab_size);
  const void* bytes = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (data[0] % 5) {
    case 0: {
      tandem::v1::PrefillRequest request;
      if (!request.ParseFromArray(bytes, n)) return 0;
      auto params = tandem::prefill::CheckPrefillRequest(request, m.instance.geometry,
                                                         m.instance.config, 16, "ucx");
      if (params.ok()) {
        FUZZ_CHECK(request.prompt_token_ids_size() >= 1);
        FUZZ_CHECK(request.prompt_token_ids_size() < m.instance.config.max_position_embeddings);
        for (int32_t id : request.prompt_token_ids()) FUZZ_CHECK(id >= 0 && id < vocab);
        // A request that sends KV has a well-formed target; one that only scores has none.
        if (params->max_tokens > 0) {
          FUZZ_CHECK(request.target().token().size() == tandem::kv::kTokenBytes);
          (void)tandem::serving::PeerOf(request.target());
        } else {
          FUZZ_CHECK(!request.has_target() && params->prompt_logprobs >= 0);
        }
      }
      break;
    }
    case 1: {
      tandem::v1::DecodeRequest request;
      if (!request.ParseFromArray(bytes, n)) return 0;
      auto params = tandem::serving::SamplingFromProto(request.sampling(), vocab);
      if (params.ok()) {
        FUZZ_CHECK(params->max_tokens >= 1 || params->prompt_logprobs >= 0);
        if (params->logprobs >= 0 && request.has_first_token_logprobs()) {
          (void)tandem::serving::CheckLogprobs(request.first_token_logprobs(),
                                               request.first_token_id(), vocab, params->logprobs);
        }
      }
      break;
    }
    case 2: {
      tandem::v1::ReserveRequest request;
      if (!request.ParseFromArray(bytes, n)) return 0;
      (void)request.prompt_tokens();
      break;
    }
    case 3: {
      tandem::v1::KvTarget target;
      if (!target.ParseFromArray(bytes, n)) return 0;
      (void)tandem::kv::CheckCompatible(m.instance.geometry, target.geometry());
      break;
    }
    default: {
      tandem::v1::ReleaseRequest request;
      if (!request.ParseFromArray(bytes, n)) return 0;
      break;
    }
  }
  return 0;
}
