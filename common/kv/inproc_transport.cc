#include "common/kv/inproc_transport.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<std::unique_ptr<InProcessTransport>> InProcessTransport::Create(
    std::shared_ptr<InProcessFabric> fabric, std::string agent, size_t chunk_bytes) {
  if (agent.empty()) return absl::InvalidArgumentError("an agent needs a name");
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be > 0");
  absl::MutexLock lock(&fabric->mu_);
  if (!fabric->agents_.emplace(agent, nullptr).second) {
    return absl::AlreadyExistsError(absl::StrCat("agent \"", agent, "\" is attached already"));
  }
  return std::unique_ptr<InProcessTransport>(
      new InProcessTransport(std::move(fabric), std::move(agent), chunk_bytes));
}

InProcessTransport::~InProcessTransport() {
  absl::MutexLock lock(&fabric_->mu_);
  fabric_->agents_.erase(agent_);
}

absl::Status InProcessTransport::SetReceiver(KvReceiver* receiver) {
  absl::MutexLock lock(&fabric_->mu_);
  fabric_->agents_[agent_] = receiver;
  return absl::OkStatus();
}

absl::StatusOr<TransferId> InProcessTransport::PostSend(const KvPeer& peer, std::string token,
                                                        uint64_t size, Fill fill) {
  absl::Status status;
  {
    absl::MutexLock lock(&fabric_->mu_);
    auto it = fabric_->agents_.find(peer.agent);
    if (it == fabric_->agents_.end()) {
      return absl::UnavailableError(absl::StrCat("agent \"", peer.agent, "\" is not attached"));
    }
    KvReceiver* receiver = it->second;
    if (receiver == nullptr) {
      status = absl::UnavailableError(absl::StrCat("agent \"", peer.agent, "\" takes no KV"));
    }
    std::vector<char> chunk;
    for (uint64_t offset = 0; status.ok() && offset < size; offset += chunk_bytes_) {
      chunk.resize(static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, size - offset)));
      status = fill(offset, absl::MakeSpan(chunk));
      // What the receiver drops is for the commit to report, as over a network.
      if (status.ok()) (void)receiver->Write(token, offset, {chunk.data(), chunk.size()});
    }
    if (status.ok()) status = receiver->Commit(token, size);
  }
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_transfer_++;
  done_[id] = status;
  return TransferId{id};
}

absl::StatusOr<bool> InProcessTransport::Poll(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = done_.find(static_cast<uint64_t>(id));
  if (it == done_.end()) {
    return absl::NotFoundError(
        absl::StrCat("transfer ", static_cast<uint64_t>(id), " is unknown or released"));
  }
  if (!it->second.ok()) return it->second;
  return true;
}

void InProcessTransport::Release(TransferId id) {
  absl::MutexLock lock(&mu_);
  done_.erase(static_cast<uint64_t>(id));
}

}  // namespace tandem::kv
