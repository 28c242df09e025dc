#include "common/kv/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::kv {
namespace {

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// "host:port" -> IPv4 sockaddr.
absl::StatusOr<sockaddr_in> ParseAgent(const std::string& agent) {
  const size_t colon = agent.rfind(':');
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(agent.substr(colon + 1), &port) ||
      port <= 0 || port > 65535 ||
      inet_pton(AF_INET, agent.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent \"", agent, "\" is not an IPv4 host:port"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// A descriptor's remote_key: the region's base address (8 bytes), the length of the owner's
// worker address (4 bytes), that address, then the packed remote key; host byte order.
struct RemoteKey {
  uint64_t base = 0;
  absl::string_view worker_address;
  absl::string_view rkey;
};

std::string PackRemoteKey(uint64_t base, absl::string_view worker_address, absl::string_view rkey) {
  std::string out(reinterpret_cast<const char*>(&base), sizeof(base));
  const uint32_t length = static_cast<uint32_t>(worker_address.size());
  out.append(reinterpret_cast<const char*>(&length), sizeof(length));
  out.append(worker_address.data(), worker_address.size());
  out.append(rkey.data(), rkey.size());
  return out;
}

absl::StatusOr<RemoteKey> ParseRemoteKey(absl::string_view packed) {
  RemoteKey key;
  uint32_t length = 0;
  if (packed.size() < sizeof(key.base) + sizeof(length)) {
    return absl::InvalidArgumentError("the remote region's descriptor carries no UCX key");
  }
  std::memcpy(&key.base, packed.data(), sizeof(key.base));
  std::memcpy(&length, packed.data() + sizeof(key.base), sizeof(length));
  packed.remove_prefix(sizeof(key.base) + sizeof(length));
  if (length > packed.size() || packed.size() - length == 0) {
    return absl::InvalidArgumentError("the remote region's UCX key is truncated");
  }
  key.worker_address = packed.substr(0, length);
  key.rkey = packed.substr(length);
  return key;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  if (options.max_put_bytes == 0) return absl::InvalidArgumentError("max_put_bytes must be > 0");
  std::unique_ptr<UcxTransport> t(new UcxTransport(options));
  RETURN_IF_ERROR(t->Start());
  return t;
}

absl::Status UcxTransport::Start() {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("ucp_config_read", s);
  }
  if (!options_.transports.empty()) {
    if (ucs_status_t s = ucp_config_modify(config, "TLS", options_.transports.c_str());
        s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX transports \"", options_.transports, "\": ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread calls UCX
  if (s = ucp_worker_create(context_, &worker_params, &worker_); s != UCS_OK) {
    return UcxError("ucp_worker_create", s);
  }
  if (s = ucp_worker_get_efd(worker_, &worker_fd_); s != UCS_OK) {
    return UcxError("ucp_worker_get_efd", s);
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  if (s = ucp_worker_get_address(worker_, &address, &address_length); s != UCS_OK) {
    return UcxError("ucp_worker_get_address", s);
  }
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.listen_port));
  if (inet_pton(AF_INET, options_.listen_host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen host \"", options_.listen_host, "\" is not an IPv4 address"));
  }
  ucp_listener_params_t listener_params{};
  listener_params.field_mask =
      UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  listener_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  listener_params.sockaddr.addrlen = sizeof(addr);
  listener_params.conn_handler.cb = &UcxTransport::OnConnection;
  listener_params.conn_handler.arg = this;
  if (s = ucp_listener_create(worker_, &listener_params, &listener_); s != UCS_OK) {
    return UcxError(absl::StrCat("listening on ", options_.listen_host, ":", options_.listen_port,
                                 " (UCX needs tcp among its transports for this)"),
                    s);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (s = ucp_listener_query(listener_, &attr); s != UCS_OK) {
    return UcxError("ucp_listener_query", s);
  }
  const auto* bound = reinterpret_cast<const sockaddr_in*>(&attr.sockaddr);
  agent_ = absl::StrCat(options_.listen_host, ":", ntohs(bound->sin_port));

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  progress_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (progress_.joinable()) {
    (void)RunOnWorker([this] {
      Shutdown();
      return absl::OkStatus();
    });
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    progress_.join();
  } else {
    Shutdown();
  }
  for (auto& [id, region] : regions_) ucp_mem_unmap(context_, region.memh);
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

// Closes every endpoint, waiting (bounded) for the closes to finish.
void UcxTransport::Shutdown() {
  std::vector<ucs_status_ptr_t> closing;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (auto& [agent, peer] : peers_) {
    for (auto& [id, rkey] : peer.rkeys) ucp_rkey_destroy(rkey);
    peer.rkeys.clear();
    if (peer.ep != nullptr) closing.push_back(ucp_ep_close_nbx(peer.ep, &param));
    peer.ep = nullptr;
  }
  for (ucp_ep_h ep : accepted_) closing.push_back(ucp_ep_close_nbx(ep, &param));
  accepted_.clear();
  peers_.clear();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (ucs_status_ptr_t request : closing) {
    if (request == nullptr || UCS_PTR_IS_ERR(request)) continue;
    while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(request);
  }
}

void UcxTransport::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

absl::Status UcxTransport::RunOnWorker(std::function<absl::Status()> fn) {
  auto promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = promise->get_future();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::FailedPreconditionError("the UCX transport is shutting down");
    commands_.push_back([fn = std::move(fn), promise] { promise->set_value(fn()); });
  }
  Wake();
  if (result.wait_for(absl::ToChronoNanoseconds(options_.call_deadline)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError("the UCX progress thread did not answer in time");
  }
  return result.get();
}

void UcxTransport::ProgressLoop() {
  while (true) {
    std::deque<std::function<void()>> commands;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      commands.swap(commands_);
      stop = stop_;
    }
    for (auto& command : commands) command();
    if (stop) return;
    while (ucp_worker_progress(worker_) != 0) {
    }
    if (in_flight_.load(std::memory_order_relaxed) > 0) continue;  // busy-poll while sending
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, 100);
    uint64_t drained;
    while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
  }
}

void UcxTransport::OnConnection(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<UcxTransport*>(arg);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode =
      self->options_.detect_dead_peers ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxTransport::OnEndpointError;
  params.err_handler.arg = self;
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(self->worker_, &params, &ep) == UCS_OK) self->accepted_.push_back(ep);
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<UcxTransport*>(arg)->FailPeer(ep, status);
}

void UcxTransport::FailPeer(ucp_ep_h ep, ucs_status_t status) {
  for (auto& [agent, peer] : peers_) {
    if (peer.ep == ep && peer.error.ok()) {
      peer.error = UcxError(absl::StrCat("peer ", agent, " failed"), status);
    }
  }
  // Requests on the endpoint complete with errors through OnSendDone. An accepted endpoint
  // only receives puts: close it now.
  for (auto it = accepted_.begin(); it != accepted_.end(); ++it) {
    if (*it != ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
    accepted_.erase(it);
    break;
  }
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* context = static_cast<RequestContext*>(user_data);
  context->transport->Complete(context->transfer, status);
  context->transport->in_flight_.fetch_sub(1, std::memory_order_relaxed);
  delete context;
  ucp_request_free(request);
}

void UcxTransport::Complete(const std::shared_ptr<Transfer>& transfer, ucs_status_t status) {
  absl::MutexLock lock(&transfer->mu);
  --transfer->pending;
  if (status != UCS_OK && transfer->status.ok()) {
    transfer->status = UcxError(absl::StrCat("KV write to ", transfer->peer), status);
  }
}

absl::StatusOr<UcxTransport::Peer*> UcxTransport::Connect(const std::string& agent,
                                                          absl::string_view worker_address) {
  auto it = peers_.find(agent);
  if (it != peers_.end()) {
    if (it->second.error.ok()) return &it->second;
    // A failed peer: report it once, then forget it, so a restarted one can be reached again.
    absl::Status error = it->second.error;
    for (auto& [id, rkey] : it->second.rkeys) ucp_rkey_destroy(rkey);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t request = ucp_ep_close_nbx(it->second.ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
    peers_.erase(it);
    return error;
  }
  ASSIGN_OR_RETURN(sockaddr_in addr, ParseAgent(agent));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  if (!worker_address.empty()) {
    params.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  } else {
    params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof(addr);
  }
  params.err_mode =
      options_.detect_dead_peers ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxTransport::OnEndpointError;
  params.err_handler.arg = this;
  Peer peer;
  if (ucs_status_t s = ucp_ep_create(worker_, &params, &peer.ep); s != UCS_OK) {
    return UcxError(absl::StrCat("connecting to ", agent), s);
  }
  return &(peers_[agent] = std::move(peer));
}

absl::StatusOr<MemoryDescriptor> UcxTransport::MapLocked(void* base, size_t size, void** mapped) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = base;
  params.length = size;
  params.flags = base == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t s = ucp_mem_map(context_, &params, &memh); s != UCS_OK) {
    return UcxError(base == nullptr ? "allocating memory" : "registering memory", s);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(memh, &attr); s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return UcxError("querying registered memory", s);
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, memh, &packed, &packed_size); s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return UcxError("packing the remote key", s);
  }
  MemoryDescriptor descriptor;
  descriptor.remote_key =
      PackRemoteKey(reinterpret_cast<uintptr_t>(attr.address), worker_address_,
                    absl::string_view(static_cast<const char*>(packed), packed_size));
  ucp_rkey_buffer_release(packed);
  const uint64_t id = next_region_++;
  regions_[id] = {static_cast<char*>(attr.address), size, memh};
  descriptor.agent = agent_;
  descriptor.region_id = id;
  descriptor.size = size;
  *mapped = attr.address;
  return descriptor;
}

absl::StatusOr<MemoryDescriptor> UcxTransport::RegisterMemory(void* base, size_t size) {
  if (base == nullptr || size == 0) {
    return absl::InvalidArgumentError("cannot register an empty region");
  }
  absl::StatusOr<MemoryDescriptor> result = absl::InternalError("not run");
  RETURN_IF_ERROR(RunOnWorker([&]() -> absl::Status {
    void* mapped = nullptr;
    result = MapLocked(base, size, &mapped);
    return result.status();
  }));
  return result;
}

absl::StatusOr<std::pair<void*, MemoryDescriptor>> UcxTransport::AllocateMemory(size_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot allocate an empty region");
  absl::StatusOr<MemoryDescriptor> result = absl::InternalError("not run");
  void* mapped = nullptr;
  RETURN_IF_ERROR(RunOnWorker([&]() -> absl::Status {
    result = MapLocked(nullptr, size, &mapped);
    return result.status();
  }));
  return std::make_pair(mapped, *std::move(result));
}

absl::Status UcxTransport::DeregisterMemory(const MemoryDescriptor& region) {
  return RunOnWorker([&]() -> absl::Status {
    auto it = regions_.find(region.region_id);
    if (region.agent != agent_ || it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", region.region_id, " of agent \"",
                                              region.agent, "\" is not registered by \"", agent_,
                                              "\""));
    }
    ucp_mem_unmap(context_, it->second.memh);
    regions_.erase(it);
    return absl::OkStatus();
  });
}

absl::StatusOr<TransferId> UcxTransport::PostWrite(const MemoryDescriptor& local,
                                                   const MemoryDescriptor& remote,
                                                   absl::Span<const CopySpan> spans) {
  if (local.agent != agent_) {
    return absl::InvalidArgumentError(absl::StrCat("the source region belongs to \"", local.agent,
                                                   "\", not to \"", agent_, "\""));
  }
  ASSIGN_OR_RETURN(const RemoteKey key, ParseRemoteKey(remote.remote_key));
  RETURN_IF_ERROR(CheckSpans(spans, local.size, remote.size));
  auto transfer = std::make_shared<Transfer>();
  transfer->peer = remote.agent;
  RETURN_IF_ERROR(RunOnWorker([&]() -> absl::Status {
    auto region = regions_.find(local.region_id);
    if (region == regions_.end() || region->second.size != local.size) {
      return absl::NotFoundError(
          absl::StrCat("local region ", local.region_id, " is not registered"));
    }
    ASSIGN_OR_RETURN(Peer * peer, Connect(remote.agent, key.worker_address));
    ucp_rkey_h& rkey = peer->rkeys[remote.region_id];
    if (rkey == nullptr) {
      if (ucs_status_t s = ucp_ep_rkey_unpack(peer->ep, key.rkey.data(), &rkey); s != UCS_OK) {
        peer->rkeys.erase(remote.region_id);
        return UcxError("unpacking the remote key", s);
      }
    }
    const uint64_t remote_base = key.base;
    auto post = [&](ucs_status_ptr_t request, RequestContext* context) -> absl::Status {
      if (request == nullptr) {  // completed in place
        delete context;
        return absl::OkStatus();
      }
      if (UCS_PTR_IS_ERR(request)) {
        delete context;
        return UcxError(absl::StrCat("KV write to ", remote.agent), UCS_PTR_STATUS(request));
      }
      absl::MutexLock lock(&transfer->mu);
      ++transfer->pending;
      in_flight_.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    };
    auto params = [&](RequestContext* context) {
      ucp_request_param_t p{};
      p.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
      p.cb.send = &UcxTransport::OnSendDone;
      p.user_data = context;
      p.memh = region->second.memh;
      return p;
    };
    for (const CopySpan& span : spans) {
      for (uint64_t done = 0; done < span.length; done += options_.max_put_bytes) {
        const uint64_t length = std::min<uint64_t>(options_.max_put_bytes, span.length - done);
        auto* context = new RequestContext{this, transfer};
        ucp_request_param_t p = params(context);
        RETURN_IF_ERROR(post(ucp_put_nbx(peer->ep, region->second.base + span.src_offset + done,
                                         length, remote_base + span.dst_offset + done, rkey, &p),
                             context));
      }
    }
    // The flush completes once every put has landed at the peer.
    auto* context = new RequestContext{this, transfer};
    ucp_request_param_t p = params(context);
    p.op_attr_mask &= ~UCP_OP_ATTR_FIELD_MEMH;
    RETURN_IF_ERROR(post(ucp_ep_flush_nbx(peer->ep, &p), context));
    absl::MutexLock lock(&transfer->mu);
    transfer->posted = true;
    return absl::OkStatus();
  }));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_transfer_++;
  transfers_[id] = transfer;
  return TransferId{id};
}

absl::StatusOr<bool> UcxTransport::Poll(TransferId id) {
  std::shared_ptr<Transfer> transfer;
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(static_cast<uint64_t>(id));
    if (it == transfers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("transfer ", static_cast<uint64_t>(id), " is unknown or released"));
    }
    transfer = it->second;
  }
  absl::MutexLock lock(&transfer->mu);
  if (!transfer->status.ok()) return transfer->status;
  return transfer->posted && transfer->pending == 0;
}

void UcxTransport::Release(TransferId id) {
  absl::MutexLock lock(&mu_);
  transfers_.erase(static_cast<uint64_t>(id));
}

}  // namespace tandem::kv
