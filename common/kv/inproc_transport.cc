#include "common/kv/inproc_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<std::unique_ptr<InProcessTransport>> InProcessTransport::Create(
    std::shared_ptr<InProcessFabric> fabric, std::string agent) {
  if (agent.empty()) return absl::InvalidArgumentError("an agent needs a name");
  absl::MutexLock lock(&fabric->mu_);
  if (!fabric->agents_.insert(agent).second) {
    return absl::AlreadyExistsError(absl::StrCat("agent \"", agent, "\" is attached already"));
  }
  return std::unique_ptr<InProcessTransport>(
      new InProcessTransport(std::move(fabric), std::move(agent)));
}

InProcessTransport::~InProcessTransport() {
  absl::MutexLock lock(&fabric_->mu_);
  fabric_->agents_.erase(agent_);
  auto it = fabric_->regions_.lower_bound({agent_, 0});
  while (it != fabric_->regions_.end() && it->first.first == agent_) {
    it = fabric_->regions_.erase(it);
  }
}

absl::StatusOr<MemoryDescriptor> InProcessTransport::RegisterMemory(void* base, size_t size) {
  if (base == nullptr || size == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  absl::MutexLock lock(&fabric_->mu_);
  const uint64_t id = fabric_->next_region_++;
  fabric_->regions_[{agent_, id}] = {static_cast<char*>(base), size};
  return MemoryDescriptor{agent_, id, size, ""};
}

absl::Status InProcessTransport::DeregisterMemory(const MemoryDescriptor& region) {
  absl::MutexLock lock(&fabric_->mu_);
  if (region.agent != agent_ || fabric_->regions_.erase({agent_, region.region_id}) == 0) {
    return absl::NotFoundError(absl::StrCat("region ", region.region_id, " of agent \"",
                                            region.agent, "\" is not registered by \"", agent_,
                                            "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferId> InProcessTransport::PostWrite(const MemoryDescriptor& local,
                                                         const MemoryDescriptor& remote,
                                                         absl::Span<const CopySpan> spans) {
  {
    // The copy runs under the fabric's lock, so neither region can be deregistered under it.
    absl::MutexLock lock(&fabric_->mu_);
    if (local.agent != agent_) {
      return absl::InvalidArgumentError(absl::StrCat("the source region belongs to \"", local.agent,
                                                     "\", not to \"", agent_, "\""));
    }
    auto src = fabric_->regions_.find({local.agent, local.region_id});
    auto dst = fabric_->regions_.find({remote.agent, remote.region_id});
    if (src == fabric_->regions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("local region ", local.region_id, " is not registered"));
    }
    if (dst == fabric_->regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", remote.region_id, " of agent \"",
                                              remote.agent, "\" is not registered"));
    }
    if (absl::Status s = CheckSpans(spans, src->second.size, dst->second.size); !s.ok()) return s;
    for (const CopySpan& span : spans) {
      std::memmove(dst->second.base + span.dst_offset, src->second.base + span.src_offset,
                   span.length);
    }
  }
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_transfer_++;
  done_.insert(id);
  return TransferId{id};
}

absl::StatusOr<bool> InProcessTransport::Poll(TransferId id) {
  absl::MutexLock lock(&mu_);
  if (!done_.contains(static_cast<uint64_t>(id))) {
    return absl::NotFoundError(
        absl::StrCat("transfer ", static_cast<uint64_t>(id), " is unknown or released"));
  }
  return true;
}

void InProcessTransport::Release(TransferId id) {
  absl::MutexLock lock(&mu_);
  done_.erase(static_cast<uint64_t>(id));
}

}  // namespace tandem::kv
