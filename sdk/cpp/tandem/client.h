// Tandem's C++ client SDK: a thin, synchronous layer over the gateway's gRPC API, with
// deadlines on every call and errors as absl::Status (the server's code and message kept).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/gateway.grpc.pb.h"

namespace tandem::sdk {

struct ClientOptions {
  // Deadline of each call (a streamed call: of the whole stream).
  absl::Duration timeout = absl::Seconds(60);
  // A stream that brings nothing, not even the gateway's keep-alives (every 2 s), for this long
  // ends with UNAVAILABLE; zero: no idle limit.
  absl::Duration idle_timeout = absl::Seconds(30);
  int max_message_bytes = 64 << 20;
  // PEM root certificates: when set, the connection uses TLS and trusts these roots.
  std::string tls_root_certs;
};

// Cancels a call in flight from another thread (or from the call's own chunk callback). A
// cancelled call returns CANCELLED, and the server frees what it held for it.
class Cancellation {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class Client;
  void Attach(grpc::ClientContext* context);

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class Client {
 public:
  // Connects to a gateway at `target` ("host:port"); fails if it is not reachable within
  // `connect_timeout`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, ClientOptions options = {},
      absl::Duration connect_timeout = absl::Seconds(5));

  // `cancel`, when set, can abort the call (CANCELLED) before its deadline.
  absl::StatusOr<tandem::v1::GenerateResponse> Generate(const tandem::v1::GenerateRequest& request,
                                                        Cancellation* cancel = nullptr);
  // `n` choices of one request (OpenAI's `n`), run side by side: choice i is the request with
  // seed + i when it has a seed, so a seeded call repeats exactly, as the OpenAI front's `n`
  // does. The first failure is returned (the other calls still end within the deadline);
  // INVALID_ARGUMENT for n outside [1, 16].
  absl::StatusOr<std::vector<tandem::v1::GenerateResponse>> GenerateChoices(
      const tandem::v1::GenerateRequest& request, int n);
  // Calls `on_chunk` for every streamed chunk, in order (keep-alives are not passed on);
  // returns the stream's final status.
  absl::Status GenerateStream(
      const tandem::v1::GenerateRequest& request,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk,
      Cancellation* cancel = nullptr);
  absl::StatusOr<tandem::v1::TokenizeResponse> Tokenize(const tandem::v1::TokenizeRequest& request);
  absl::StatusOr<tandem::v1::ListModelsResponse> ListModels();
  // grpc.health.v1 status of the whole server: OK when SERVING.
  absl::Status Health();

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);
  void SetDeadline(grpc::ClientContext* context) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::Gateway::Stub> stub_;
  const ClientOptions options_;
};

}  // namespace tandem::sdk
