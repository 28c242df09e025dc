// tandem-prefill's gRPC service: full-expert chunked prefill that ships the prompt's KV cache
// to a decode instance. Until the service path lands (issue #5), Prefill answers UNIMPLEMENTED
// (saying so); GetInfo reports the instance's model and KV geometry.
#pragma once

#include <string>

#include "common/rpc/rpc_metrics.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::prefill {

class PrefillService final : public tandem::v1::Prefill::CallbackService {
 public:
  PrefillService(std::string model_name, tandem::v1::KvGeometry geometry, rpc::RpcMetrics* metrics)
      : model_name_(std::move(model_name)), geometry_(std::move(geometry)), metrics_(metrics) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::InstanceInfoRequest* request,
                                    tandem::v1::InstanceInfo* response) override;

 private:
  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  rpc::RpcMetrics* metrics_;
};

}  // namespace tandem::prefill
