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
};

class GatewayService final : public tandem::v1::Gateway::CallbackService {
 public:
  // `backend` runs the generations: the cluster's Dispatcher, or an engine in this process.
  GatewayService(GatewayConfig config, std::unique_ptr<model::Tokenizer> tokenizer,
                 std::unique_ptr<GenerationBackend> backend, rpc::RpcMetrics* metrics,
                 serving::GatewayMetrics* serving_metrics);
  // Cancels the requests still running and waits (up to 10 s) for their threads.
  ~GatewayService() override;

  // Runs `fn` on a worker thread the destructor waits for; false when stopping.
  bool Spawn(std::function<void()> fn);

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
  grpc::Status ValidateGenerate(const tandem::v1::GenerateRequest& request) const;
  grpc::Status CheckModel(const std::string& model) const;
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, absl::string_view rpc,
                                   const grpc::Status& status, absl::Time start);

  // The prompt's token ids (BOS as configured) and the max_tokens to ask for; errors are
  // INVALID_ARGUMENT.
  absl::Status Prepare(const tandem::v1::GenerateRequest& request, std::vector<int32_t>* ids,
                       int* max_tokens, std::string* request_id);

  const GatewayConfig config_;
  const std::unique_ptr<model::Tokenizer> tokenizer_;
  // Runs one request through the dispatcher, recording what clients see.
  absl::Status Dispatch(
      const std::string& request_id, const std::vector<int32_t>& prompt,
      const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
      absl::Time start,
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
