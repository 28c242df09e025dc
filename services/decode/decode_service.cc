#include "services/decode/decode_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tandem::decode {
namespace {

grpc::Status NotYet(absl::string_view rpc) {
  return grpc::Status(
      grpc::StatusCode::UNIMPLEMENTED,
      absl::StrCat(rpc,
                   " is not available in this build: the decode "
                   "service path and the KV transfer (issue #5) have not landed yet"));
}

}  // namespace

grpc::ServerUnaryReactor* DecodeService::Refuse(grpc::CallbackServerContext* context,
                                                absl::string_view rpc) {
  const grpc::Status status = NotYet(rpc);
  metrics_->Record(rpc, status, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Reserve(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReserveRequest* request,
                                                 tandem::v1::ReserveResponse* response) {
  return Refuse(context, "Reserve");
}

grpc::ServerWriteReactor<tandem::v1::GenerateStreamResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) {
  const grpc::Status status = NotYet("Decode");
  metrics_->Record("Decode", status, absl::ZeroDuration());
  return rpc::FinishedWriter<tandem::v1::GenerateStreamResponse>(status);
}

grpc::ServerUnaryReactor* DecodeService::Release(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReleaseRequest* request,
                                                 tandem::v1::ReleaseResponse* response) {
  return Refuse(context, "Release");
}

grpc::ServerUnaryReactor* DecodeService::GetInfo(grpc::CallbackServerContext* context,
                                                 const tandem::v1::InstanceInfoRequest* request,
                                                 tandem::v1::InstanceInfo* response) {
  response->set_role("decode");
  response->set_model(model_name_);
  *response->mutable_geometry() = geometry_;
  metrics_->Record("GetInfo", grpc::Status::OK, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::decode
