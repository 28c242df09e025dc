#include "services/prefill/prefill_service.h"

#include "absl/time/clock.h"

namespace tandem::prefill {

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const tandem::v1::PrefillRequest* request,
                                                  tandem::v1::PrefillResponse* response) {
  const grpc::Status status(grpc::StatusCode::UNIMPLEMENTED,
                            "Prefill is not available in this build: the prefill "
                            "service path and the KV transfer (issue #5) have not landed yet");
  metrics_->Record("Prefill", status, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* PrefillService::GetInfo(grpc::CallbackServerContext* context,
                                                  const tandem::v1::InstanceInfoRequest* request,
                                                  tandem::v1::InstanceInfo* response) {
  response->set_role("prefill");
  response->set_model(model_name_);
  *response->mutable_geometry() = geometry_;
  metrics_->Record("GetInfo", grpc::Status::OK, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::prefill
