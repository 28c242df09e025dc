// tandem-gateway's public gRPC service. It tokenizes, lists the model it fronts, and runs
// Generate / GenerateStream as reserve -> prefill -> decode across the instances it knows
// (dispatcher.h), each request on a worker thread of its own so that reactors never block;
// a client that goes away cancels the request downstream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/model/config.h"
#include "common/model/tokenizer.h"
#include "common/rpc/rpc_metrics.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/dispatcher.h"
#include "tandem/v1/gateway.grpc.pb.h"

namespace tandem::gateway {

struct GatewayConfig {
  std::string model_name;
  model::ModelConfig model_config;
  bool add_bos_token = true;  // tokenizer_config.json's add_bos_token
  std::vector<std::string> prefill_targets;
  std::vector<std::string> decode_targets;
  size_t max_prompt_bytes = 1 << 20;
  // Generations running at once (gRPC and HTTP together); more are refused with
  // RESOURCE_EXHAUSTED (HTTP 429).
  int max_inflight = 256;
};

class GatewayService final : public tandem::v1::Gateway::CallbackService {
 public:
  // `backend` runs the generations: the cluster's Dispatcher, or an engine in this process.
  GatewayService(GatewayConfig config, std::unique_ptr<model::Tokenizer> tokenizer,
                 std::unique_ptr<GenerationBackend> backend, rpc::RpcMetrics* metrics,
                 serving::GatewayMetrics* serving_metrics);
  // Refuses new requests and waits (up to 10 s) for the running ones.
  ~GatewayService() override;

  // A checked, tokenized request, ready to run.
  struct Prepared {
    std::string request_id;
    std::vector<int32_t> prompt;  // token ids, BOS as configured
    int max_tokens = 0;           // the request's, or the default; within the context
    tandem::v1::SamplingParams sampling;
    absl::Time start;  // arrival, for time to first token and latency
  };
  // Checks and tokenizes `request` as Generate does. Errors: INVALID_ARGUMENT for a request
  // no backend could ever serve, NOT_FOUND for an unknown model.
  absl::StatusOr<Prepared> Prepare(const tandem::v1::GenerateRequest& request);

  // Runs a prepared request to its end on the calling thread (the HTTP front's), each chunk
  // to `on_chunk`. RESOURCE_EXHAUSTED when max_inflight generations are running, UNAVAILABLE
  // while stopping; CANCELLED once `call` is cancelled.
  absl::Status Execute(
      const Prepared& request, DispatchCall* call,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk);

  const GatewayConfig& config() const { return config_; }

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

 private:
  // INVALID_ARGUMENT for a request no backend could ever serve (checked before anything
  // else, so bad input is reported as such even while generation is unavailable).
  absl::Status ValidateGenerate(const tandem::v1::GenerateRequest& request) const;
  absl::Status CheckModel(const std::string& model) const;
  // Takes a place among the running generations (see max_inflight); Leave gives it back.
  absl::Status Enter();
  void Leave();
  // Runs `fn` on a worker thread that holds a place (Enter) until it ends.
  absl::Status Spawn(std::function<void()> fn);
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   const grpc::Status& status, absl::Time start);

  const GatewayConfig config_;
  const std::unique_ptr<model::Tokenizer> tokenizer_;
  // Runs one request through the dispatcher, recording what clients see.
  absl::Status Dispatch(
      const Prepared& request, DispatchCall* call,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk);

  rpc::RpcMetrics* metrics_;
  serving::GatewayMetrics* serving_metrics_;
  const std::unique_ptr<GenerationBackend> backend_;
  absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tandem::gateway
