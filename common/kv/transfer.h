// Moving a prompt's KV cache from prefill to decode: the transport interface.
//
// KV lifetime is safe by construction: the receiving process writes every byte into its own
// blocks itself. A decode instance opens an inbox for each reservation (inbox.h) under a
// fresh unguessable token; prefill sends the reservation's KV stream (kv_stream.h) as
// messages naming that token and an offset, then a commit; the receiver copies each message
// into the reservation's blocks only while the inbox is open, checks every range against the
// reservation, and answers the commit with whether every byte arrived. Once the reservation
// ends (Decode took it, Release, or its lease), its inbox is closed, and anything still on its
// way — a stalled prefill that resumes, a retry that lost the race — is dropped: no write can
// land in a block after its reservation ended, whatever the timing. No memory is registered
// for peers and no remote keys are handed out (with UCX, only active messages are used: no
// one-sided puts into decode's pool).
//
// The sender's side owns its source: `fill` reads the local blocks chunk by chunk, on the
// transport's thread, and never after Release returns, so prefill frees its blocks once it
// has released the transfer; bytes already handed to the transport are the transport's.
//
// Implementations: InProcessTransport (inproc_transport.h; tests) and UcxTransport
// (ucx_transport.h). Errors are absl::Status: INVALID_ARGUMENT for a bad target, NOT_FOUND for
// an unknown transfer, UNAVAILABLE for a peer that cannot be reached or failed, the
// receiver's verdict (e.g. NOT_FOUND for a reservation that ended) at commit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/util/clock.h"

namespace tandem::kv {

// Bytes in a reservation token: 128 random bits, the capability to write into it.
inline constexpr size_t kTokenBytes = 16;

// The receiving side: where incoming KV goes (decode's inboxes). Called on the transport's
// thread; must be quick.
class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // Stores `data` at `offset` of reservation `token`'s KV stream. An error drops it (no such
  // reservation or it ended, a range outside its stream, bytes already received); the sender
  // learns at commit.
  virtual absl::Status Write(std::string_view token, uint64_t offset, std::string_view data) = 0;
  // The sender has sent `size` bytes: OK once they have all arrived (the reservation's KV is
  // then complete and takes no more bytes); otherwise why not.
  virtual absl::Status Commit(std::string_view token, uint64_t size) = 0;
};

// Where a sender finds a receiving agent.
struct KvPeer {
  std::string agent;    // as the transport names agents (UCX: host:port of its listener)
  std::string address;  // how to reach it directly (UCX: its worker address); may be empty
};

enum class TransferId : uint64_t {};

class KvTransport {
 public:
  // Fills `out` with the bytes of the stream at `offset`.
  using Fill = std::function<absl::Status(uint64_t offset, absl::Span<char> out)>;

  virtual ~KvTransport() = default;

  virtual std::string_view name() const = 0;
  // Whether peers may live in other processes.
  virtual bool supports_remote() const = 0;
  // How peers reach this agent.
  virtual KvPeer self() const = 0;

  // Incoming KV goes to `receiver` (null: none is accepted). It must outlive its
  // registration; once SetReceiver returns, the previous receiver is not being called.
  virtual absl::Status SetReceiver(KvReceiver* receiver) = 0;

  // Sends `size` bytes (read through `fill`) to reservation `token` at `peer`, then commits.
  virtual absl::StatusOr<TransferId> PostSend(const KvPeer& peer, std::string token, uint64_t size,
                                              Fill fill) = 0;
  // True once the receiver confirmed every byte; an error if the transfer failed or the
  // receiver refused it; false while it runs.
  virtual absl::StatusOr<bool> Poll(TransferId id) = 0;
  // Forgets a transfer; a running one is abandoned (the receiver drops what still arrives once
  // its reservation ends). When it returns, the transfer's `fill` is not running and will not
  // run again.
  virtual void Release(TransferId id) = 0;
};

// Polls `id` until it is done, failed, `deadline` passes (DEADLINE_EXCEEDED) or `cancelled`
// says so (CANCELLED); the caller still releases it.
absl::Status WaitForTransfer(KvTransport& transport, TransferId id, util::Instant deadline,
                             const std::function<bool()>& cancelled = nullptr);

// 16 bytes from the system's cryptographic random source.
std::string RandomToken();

}  // namespace tandem::kv
