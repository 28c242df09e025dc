// tandem-decode's gRPC service: reserves KV blocks for prompts, then decodes from the KV
// cache a prefill instance wrote, with continuous batching over every running sequence.
// Until the service path lands (issue #5), Reserve/Decode/Release answer UNIMPLEMENTED
// (saying so); GetInfo reports the instance's model and KV geometry.
#pragma once

#include <string>

#include "common/rpc/rpc_metrics.h"
#include "tandem/v1/decode.grpc.pb.h"

namespace tandem::decode {

class DecodeService final : public tandem::v1::Decode::CallbackService {
 public:
  DecodeService(std::string model_name, tandem::v1::KvGeometry geometry, rpc::RpcMetrics* metrics)
      : model_name_(std::move(model_name)), geometry_(std::move(geometry)), metrics_(metrics) {}

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const tandem::v1::ReserveRequest* request,
                                    tandem::v1::ReserveResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::GenerateStreamResponse>* Decode(
      grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const tandem::v1::ReleaseRequest* request,
                                    tandem::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::InstanceInfoRequest* request,
                                    tandem::v1::InstanceInfo* response) override;

 private:
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, absl::string_view rpc);

  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  rpc::RpcMetrics* metrics_;
};

}  // namespace tandem::decode
