// Moving KV blocks between processes: the transport interface, in the spirit of NIXL. An agent
// registers memory once (decode registers its whole KV block pool), hands peers the
// descriptor, and a peer posts writes of spans of its own registered memory into it, then
// polls the transfer, with a deadline, until it is done; then releases it. Prefill writes the
// prompt's blocks into the blocks decode reserved (a one-sided put, as the design's request
// path has it: decode stays free to step while the bytes land, and learns of completion from
// prefill's reply, which comes only after the transfer is done).
//
// Implementations: InProcessTransport (inproc_transport.h; colocated mode and tests) and, with
// issue #5, UCX. Errors are absl::Status: INVALID_ARGUMENT for spans outside a region,
// NOT_FOUND for an unknown agent or region, UNAVAILABLE for a dead peer, DEADLINE_EXCEEDED.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem::kv {

// What a peer needs to address registered memory.
struct MemoryDescriptor {
  std::string agent;       // the agent that registered it
  uint64_t region_id = 0;  // unique within that agent
  uint64_t size = 0;       // bytes
  std::string remote_key;  // transport-specific (UCX: the packed rkey and base address)
};

// `length` bytes from `src_offset` in the local region to `dst_offset` in the remote one.
struct CopySpan {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};

enum class TransferId : uint64_t {};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  virtual std::string_view name() const = 0;
  // Whether peers may live in other processes.
  virtual bool supports_remote() const = 0;
  // This agent's name, as peers address it.
  virtual const std::string& agent() const = 0;

  // Makes [base, base + size) a region peers can write into and this agent can write from.
  virtual absl::StatusOr<MemoryDescriptor> RegisterMemory(void* base, size_t size) = 0;
  // Ends a registration; NOT_FOUND if it is not this agent's.
  virtual absl::Status DeregisterMemory(const MemoryDescriptor& region) = 0;

  // Starts writing `spans` of the local region `local` (registered here) into `remote`.
  virtual absl::StatusOr<TransferId> PostWrite(const MemoryDescriptor& local,
                                               const MemoryDescriptor& remote,
                                               absl::Span<const CopySpan> spans) = 0;
  // True once every byte has landed; an error if the transfer failed; false while it runs.
  virtual absl::StatusOr<bool> Poll(TransferId id) = 0;
  // Forgets a finished or failed transfer (one still running is cancelled where possible).
  virtual void Release(TransferId id) = 0;
};

// Polls `id` until it is done, failed, or `deadline` passes (DEADLINE_EXCEEDED); the caller
// still releases it.
absl::Status WaitForTransfer(KvTransport& transport, TransferId id, absl::Time deadline);

// Checks that `spans` lie inside regions of `src_size` and `dst_size` bytes (INVALID_ARGUMENT
// naming the first span that does not); for implementations.
absl::Status CheckSpans(absl::Span<const CopySpan> spans, uint64_t src_size, uint64_t dst_size);

}  // namespace tandem::kv
