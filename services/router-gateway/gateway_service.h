// tandem-gateway's public gRPC service, and the admission control both front ends (gRPC and
// the OpenAI HTTP API) share. It tokenizes, lists the model it fronts, and runs Generate /
// GenerateStream on a GenerationBackend (the cluster's Dispatcher, or an engine in this
// process) without holding a thread per request.
//
// Admission: at most max_inflight generations are dispatched at once; more wait in a
// first-come queue of at most max_queued, each for at most queue_timeout, and are refused
// (RESOURCE_EXHAUSTED, HTTP 429) past those bounds. A generation the backend could not place
// (every prefill queue or decode pool full) goes back to the head of the queue and waits for
// room, within the same bounds. A client that goes away cancels its request wherever it is.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/config.h"
#include "common/model/generation_config.h"
#include "common/model/tokenizer.h"
#include "common/rpc/rpc_metrics.h"
#include "common/util/clock.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/backend.h"
#include "tandem/v1/gateway.grpc.pb.h"

namespace tandem::gateway {

struct GatewayConfig {
  std::string model_name;
  model::ModelConfig model_config;
  // generation_config.json: its eos_token_ids end every generation that does not ignore EOS;
  // the OpenAI front takes its sampling defaults.
  model::GenerationDefaults generation;
  std::vector<std::string> prefill_targets;
  std::vector<std::string> decode_targets;
  size_t max_prompt_bytes = 1 << 20;
  // Generations dispatched at once (gRPC and HTTP together).
  int max_inflight = 256;
  // Generations waiting for a place; more are refused with RESOURCE_EXHAUSTED (HTTP 429).
  int max_queued = 4096;
  // How long a generation may wait for a place (in all) before it is refused.
  absl::Duration queue_timeout = absl::Seconds(120);
  // A GenerateStream with nothing to say for this long sends a keep-alive (heartbeat).
  absl::Duration stream_heartbeat = absl::Seconds(2);
};

class GatewayService final : public tandem::v1::Gateway::CallbackService {
 public:
  // `backend` runs the generations: the cluster's Dispatcher, or an engine in this process.
  GatewayService(GatewayConfig config, std::shared_ptr<const model::Tokenizer> tokenizer,
                 std::unique_ptr<GenerationBackend> backend, rpc::RpcMetrics* metrics,
                 serving::GatewayMetrics* serving_metrics);
  // Refuses new requests, ends queued ones, cancels running ones, and waits (up to 10 s) for
  // them before the backend goes.
  ~GatewayService() override;

  // A checked, tokenized request, ready to run.
  struct Prepared {
    GenerationRequest generation;  // request id, prompt (BOS as configured), sampling
    util::Instant start;           // arrival, for time to first token and latency
  };
  // Checks and tokenizes `request` as Generate does. Errors: INVALID_ARGUMENT for a request
  // no backend could ever serve, NOT_FOUND for an unknown model.
  absl::StatusOr<Prepared> Prepare(const tandem::v1::GenerateRequest& request);

  // Token ids of a text prompt: BOS first when `add_special_tokens` and the tokenizer adds
  // one, special tokens written in the text read as themselves.
  absl::StatusOr<std::vector<int32_t>> TokenizePrompt(absl::string_view text,
                                                      bool add_special_tokens) const;

  // Runs a prepared request (at once, or once it has a place); returns at once. Its chunks
  // and then exactly one OnDone go to `sink`, from any thread. RESOURCE_EXHAUSTED past the
  // queue's bounds, UNAVAILABLE while draining, CANCELLED once `call` is cancelled.
  void Execute(Prepared request, std::shared_ptr<DispatchCall> call,
               std::shared_ptr<GenerationSink> sink);

  // New requests get UNAVAILABLE and queued ones end with it; running ones get `deadline` to
  // finish, then are cancelled (and given 5 s more to wind down).
  void Drain(absl::Duration deadline);

  // Generations dispatched now, and waiting for a place.
  int running() const;
  int queued() const;

  const GatewayConfig& config() const { return config_; }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const tandem::v1::GenerateRequest* request,
                                     tandem::v1::GenerateResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const tandem::v1::TokenizeRequest* request,
                                     tandem::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const tandem::v1::ListModelsRequest* request,
                                       tandem::v1::ListModelsResponse* response) override;

  // The queue and its counts, shared with the generations' callbacks (it outlives the
  // service while one is still running).
  class Admission;

 private:
  // INVALID_ARGUMENT for a request no backend could ever serve (checked before anything
  // else, so bad input is reported as such even while generation is unavailable).
  absl::Status ValidateGenerate(const tandem::v1::GenerateRequest& request) const;
  absl::Status CheckModel(const std::string& model) const;
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   const grpc::Status& status, util::Instant start);

  const GatewayConfig config_;
  const std::shared_ptr<const model::Tokenizer> tokenizer_;
  rpc::RpcMetrics* metrics_;
  std::unique_ptr<GenerationBackend> backend_;
  std::shared_ptr<Admission> admission_;
};

}  // namespace tandem::gateway
