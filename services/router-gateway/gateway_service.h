// tandem-gateway's public gRPC service. It tokenizes, lists the model it fronts, and (once
// the cluster path lands) runs reserve -> prefill -> decode across the instances it knows.
// Today Generate/GenerateStream answer UNIMPLEMENTED with a message that says why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/tokenizer.h"
#include "common/rpc/rpc_metrics.h"
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
  GatewayService(GatewayConfig config, std::unique_ptr<model::Tokenizer> tokenizer,
                 rpc::RpcMetrics* metrics)
      : config_(std::move(config)), tokenizer_(std::move(tokenizer)), metrics_(metrics) {}

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

  const GatewayConfig config_;
  const std::unique_ptr<model::Tokenizer> tokenizer_;
  rpc::RpcMetrics* metrics_;
};

}  // namespace tandem::gateway
