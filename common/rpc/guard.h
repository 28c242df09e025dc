// No exception may leave a gRPC callback method: one that does ends the process (gRPC's core
// is C). These wrap a method's body; what still throws is reported (util/guard.h) and the
// call finishes with INTERNAL. A body must not throw after it has finished its reactor.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string_view>

#include "common/rpc/rpc_metrics.h"
#include "common/util/guard.h"

namespace tandem::rpc {

inline grpc::Status InternalError() {
  return grpc::Status(grpc::StatusCode::INTERNAL, "internal error while handling the call");
}

// `body` returns the method's reactor.
template <typename F>
grpc::ServerUnaryReactor* GuardedUnary(grpc::CallbackServerContext* context, std::string_view rpc,
                                       F&& body) {
  grpc::ServerUnaryReactor* reactor = nullptr;
  if (util::Guarded(rpc, [&] { reactor = body(); }) && reactor != nullptr) return reactor;
  reactor = context->DefaultReactor();
  reactor->Finish(InternalError());
  return reactor;
}

template <typename T, typename F>
grpc::ServerWriteReactor<T>* GuardedStream(std::string_view rpc, F&& body) {
  grpc::ServerWriteReactor<T>* reactor = nullptr;
  if (util::Guarded(rpc, [&] { reactor = body(); }) && reactor != nullptr) return reactor;
  return FinishedWriter<T>(InternalError());
}

}  // namespace tandem::rpc
