// The UCX core's connections. Connect creates a client-server endpoint and sends a hello; the
// listening side answers with a hello-ack and only then offers the link to Accept, so Connect
// returns a working link. Close sends a "bye" AM (the peer reports "peer closed the link" at once,
// rather than a transport error, or nothing at all on transports that do not notice a closed
// endpoint) and force-closes the endpoint once the peer acknowledged the bye or after kByeBound.
// Peer failure is detected by ucp's error handler (UCP_ERR_HANDLING_MODE_PEER) with UCX endpoint
// keepalive (KEEPALIVE_INTERVAL, KEEPALIVE_NUM_EPS) enabled.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_core.h"

namespace scd::transport::ucx_internal {

ucp_ep_params_t Core::PeerErrorEndpoint() {
  // Peer failure detection (with endpoint keepalive): a dead peer's endpoint reports an error.
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnEpError;
  params.err_handler.arg = this;
  return params;
}

absl::StatusOr<std::shared_ptr<ListenerState>> Core::Listen(const std::string& address) {
  if (OnProgressThread()) {
    return absl::FailedPreconditionError("ucx: Listen must not be called from a link handler");
  }
  auto resolved = ResolveAddress(address, /*passive=*/true);
  if (!resolved.ok()) return resolved.status();

  auto listener = std::make_shared<ListenerState>();
  listener->core = this;
  struct Result {
    absl::Status status;
    uint16_t port = 0;
  };
  auto result = std::make_shared<Result>();
  SockAddr addr = *resolved;
  bool ran = RunAndWait(
      [this, listener, result, addr, address] {
        if (stopping_) {
          result->status = absl::CancelledError("ucx transport is shutting down");
          return;
        }
        ucp_listener_params_t params{};
        params.field_mask =
            UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.storage);
        params.sockaddr.addrlen = addr.length;
        params.conn_handler.cb = &Core::OnConnRequest;
        params.conn_handler.arg = listener.get();
        ucs_status_t status = ucp_listener_create(worker_, &params, &listener->handle);
        if (status != UCS_OK) {
          listener->handle = nullptr;
          result->status = absl::UnavailableError(
              absl::StrCat("ucx: cannot listen on ", address, ": ", UcsError(status)));
          return;
        }
        ucp_listener_attr_t attr{};
        attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        if (ucp_listener_query(listener->handle, &attr) == UCS_OK) {
          result->port = SockAddrPort(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
        }
        listener->address = HostPort{addr.host, result->port}.ToString();
        listeners_.push_back(listener);
      },
      kCommandBound);
  if (!ran)
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot listen on ", address, ": the transport is not running"));
  if (!result->status.ok()) return result->status;
  return listener;
}

absl::StatusOr<std::shared_ptr<LinkState>> Core::Connect(const std::string& address,
                                                         absl::Duration timeout) {
  if (OnProgressThread()) {
    return absl::FailedPreconditionError("ucx: Connect must not be called from a link handler");
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto resolved = ResolveAddress(address, /*passive=*/false);
  if (!resolved.ok()) {
    if (!ParseHostPort(address).ok()) return resolved.status();  // not an address at all
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot connect to ", address, ": ", resolved.status().message()));
  }
  auto link = std::make_shared<LinkState>(/*client_side=*/true, address);
  link->description = absl::StrCat("ucx ", address, " (", devices_text_, ")");  // until up
  SockAddr addr = *resolved;
  bool posted = Post([this, link, addr] {
    if (stopping_) {
      LinkDown(link, absl::CancelledError("the transport is shutting down"), false);
      return;
    }
    ucp_ep_params_t params = PeerErrorEndpoint();
    params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&addr.storage);
    params.sockaddr.addrlen = addr.length;
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {
      LinkDown(link, absl::UnavailableError(UcsError(status)), false);
      return;
    }
    link->ep = ep;
    eps_[ep] = link;
    link->phase = LinkState::Phase::kConnecting;
    PostAm(link, WireKind::kHello, Frame(), false);
  });
  if (!posted) {
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot connect to ", address, ": the transport is shut down"));
  }
  auto finished = [&link]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu) { return link->connect_done; };
  {
    absl::MutexLock lock(&link->mu);
    if (link->mu.AwaitWithDeadline(absl::Condition(&finished), deadline)) {
      if (link->connect_status.ok()) return link;
      return absl::UnavailableError(
          absl::StrCat("ucx: cannot connect to ", address, ": ", link->connect_status.message()));
    }
  }
  // Timed out: give up on the endpoint unless the handshake finished just now (decided on the
  // progress thread, which owns the phase).
  RunAndWait(
      [this, link] {
        if (link->phase != LinkState::Phase::kUp) {
          LinkDown(link, absl::DeadlineExceededError("connect timed out"), false);
        }
      },
      kCommandBound);
  absl::MutexLock lock(&link->mu);
  if (link->connect_done && link->connect_status.ok()) return link;
  return absl::UnavailableError(
      absl::StrCat("ucx: no answer from ", address, " within ", absl::FormatDuration(timeout)));
}

void Core::CloseListener(const std::shared_ptr<ListenerState>& listener) {
  {
    absl::MutexLock lock(&listener->mu);
    if (listener->closed) return;
    listener->closed = true;  // Accept returns Cancelled from now on
  }
  RunAndWait([this, listener] { CloseListenerNow(listener); }, kCommandBound);
}

void Core::CloseLink(const std::shared_ptr<LinkState>& link) {
  bool first;
  {
    absl::MutexLock lock(&link->mu);
    first = !link->close_called;
    link->close_called = true;
    link->open = false;  // Send fails from now on, even before the progress thread gets here
  }
  if (!first) {
    // Another Close may still be running on the progress thread (a handler closing its own
    // link); wait for it, so that no handler call is left when this Close (or ~Link) returns.
    if (!OnProgressThread() && !RunAndWait([] {}, kCommandBound)) TellHandlerHere(link);
    return;
  }
  // Waits so that the handler has had its OnLinkDown (and no other call) when Close returns.
  if (!RunAndWait(
          [this, link] {
            LinkDown(link, absl::CancelledError("link closed"), /*bye=*/true);
            Deliver(link);
          },
          kCommandBound)) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopped_) spdlog::error("ucx: closing {} timed out", link->description);
    }
    TellHandlerHere(link);
  }
}

void Core::TellHandlerHere(const std::shared_ptr<LinkState>& link) {
  // The progress thread did not run the close in time (the transport is shutting down, or it is
  // starved past the bound): the handler hears its end on this thread, through the gate, which
  // serializes it with any call the progress thread is making and makes every later one a no-op
  // (the gate delivers one OnLinkDown and nothing after it). The caller may free the handler
  // once Close returns; the progress thread's own LinkDown for this link then finds the gate down.
  // A Start still queued for the progress thread starts the gate here, after the end and with
  // the frames it held dropped (its command then finds the same handler and does nothing), so
  // the handler hears the end now and nothing else.
  LinkHandler* handler;
  {
    absl::MutexLock lock(&link->mu);
    handler = link->handler;
  }
  link->gate->Down(absl::CancelledError("link closed"), /*drop_held=*/true);
  link->gate->Start(handler);  // null (never started): nothing
}

void Core::CloseListenerNow(const std::shared_ptr<ListenerState>& listener) {
  auto it = std::find(listeners_.begin(), listeners_.end(), listener);
  if (it == listeners_.end()) return;
  // Requests that arrived before the close are refused (they still reference the ucp listener).
  for (auto& [owner, request] : conn_requests_) {
    if (owner == listener.get() && request != nullptr) {
      ucp_listener_reject(listener->handle, request);
      request = nullptr;
    }
  }
  std::deque<std::shared_ptr<LinkState>> accepted;
  {
    absl::MutexLock lock(&listener->mu);
    accepted.swap(listener->accepted);
  }
  for (auto& link : accepted) LinkDown(link, absl::CancelledError("listener closed"), true);
  for (auto& link : std::vector<std::shared_ptr<LinkState>>(handshaking_)) {
    if (link->listener == listener) LinkDown(link, absl::CancelledError("listener closed"), true);
  }
  ucp_listener_destroy(listener->handle);
  listener->handle = nullptr;
  listeners_.erase(it);
}

void Core::ProcessConnRequests() {
  if (conn_requests_.empty()) return;
  auto requests = std::move(conn_requests_);
  conn_requests_.clear();
  for (auto& [owner, request] : requests) {
    if (request == nullptr) continue;  // refused by CloseListenerNow
    std::shared_ptr<ListenerState> listener;
    for (auto& candidate : listeners_) {
      if (candidate.get() == owner) listener = candidate;
    }
    if (listener == nullptr) continue;
    bool closed;
    {
      absl::MutexLock lock(&listener->mu);
      closed = listener->closed;
    }
    if (closed || stopping_) {
      ucp_listener_reject(listener->handle, request);
      continue;
    }
    std::string remote = "?";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      remote = FormatSockAddr(reinterpret_cast<const sockaddr*>(&attr.client_address));
    }
    ucp_ep_params_t params = PeerErrorEndpoint();
    params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {
      spdlog::warn("ucx: accepting a connection from {} on {} failed: {}", remote,
                   listener->address, UcsError(status));
      continue;
    }
    auto link = std::make_shared<LinkState>(/*client_side=*/false, remote);
    link->description = absl::StrCat("ucx ", remote, " (", devices_text_, ")");
    link->ep = ep;
    link->phase = LinkState::Phase::kHandshaking;
    link->listener = listener;
    link->handshake_deadline = absl::Now() + kHandshakeBound;
    eps_[ep] = link;
    handshaking_.push_back(link);
  }
}

void Core::ProcessHellos() {
  if (hellos_.empty()) return;
  auto hellos = std::move(hellos_);
  hellos_.clear();
  for (auto& link : hellos) {
    if (link->phase != LinkState::Phase::kHandshaking) continue;
    handshaking_.erase(std::remove(handshaking_.begin(), handshaking_.end(), link),
                       handshaking_.end());
    std::shared_ptr<ListenerState> listener = std::move(link->listener);
    link->listener.reset();
    link->description = DescribeEndpoint(*link);
    link->phase = LinkState::Phase::kUp;
    PostAm(link, WireKind::kHelloAck, Frame(), false);
    if (link->phase != LinkState::Phase::kUp) continue;
    bool offered = false;
    {
      absl::MutexLock lock(&listener->mu);
      if (!listener->closed) {
        listener->accepted.push_back(link);
        offered = true;
      }
    }
    if (!offered) LinkDown(link, absl::CancelledError("listener closed"), true);
  }
}

void Core::ProcessHelloAcks() {
  if (hello_acks_.empty()) return;
  auto acks = std::move(hello_acks_);
  hello_acks_.clear();
  for (auto& link : acks) {
    if (link->phase != LinkState::Phase::kConnecting) continue;
    link->description = DescribeEndpoint(*link);
    link->phase = LinkState::Phase::kUp;
    absl::MutexLock lock(&link->mu);
    link->connect_done = true;  // publishes the link (and its description) to Connect
    link->connect_status = absl::OkStatus();
  }
}

std::string Core::DescribeEndpoint(const LinkState& link) {
  const std::vector<std::string> lanes = EndpointLanes(link.ep);
  return absl::StrCat("ucx ", link.remote, " (",
                      lanes.empty() ? devices_text_ : absl::StrJoin(lanes, ","), ")");
}

void Core::CheckHandshakes(absl::Time now) {
  for (auto& link : std::vector<std::shared_ptr<LinkState>>(handshaking_)) {
    if (link->phase == LinkState::Phase::kHandshaking && now >= link->handshake_deadline) {
      spdlog::warn("ucx: {} sent no hello within {}; dropping it", link->remote,
                   absl::FormatDuration(kHandshakeBound));
      LinkDown(link, absl::DeadlineExceededError("no hello"), false);
    }
  }
}

void Core::LinkDown(const std::shared_ptr<LinkState>& link, absl::Status status, bool bye) {
  if (link->phase == LinkState::Phase::kDown) {
    // Down already (the peer closed); a Close here still drops what was held for Start, and the
    // receive buffers with it, while the handler hears the peer's reason.
    if (bye && !link->closed_here) {
      link->closed_here = true;
      link->ready.clear();
      if (link->down_reported) link->gate->Down(link->down_status, /*drop_held=*/true);
    }
    return;
  }
  const bool could_bye =
      link->phase == LinkState::Phase::kUp || link->phase == LinkState::Phase::kHandshaking;
  if (link->phase == LinkState::Phase::kHandshaking) {
    handshaking_.erase(std::remove(handshaking_.begin(), handshaking_.end(), link),
                       handshaking_.end());
  }
  link->phase = LinkState::Phase::kDown;
  link->down_status = status;
  link->listener.reset();
  link->closed_here = bye;
  std::deque<Frame> dropped;  // released after the unlock
  {
    absl::MutexLock lock(&link->mu);
    link->open = false;
    dropped = link->inbox.TakeAll();
    if (!link->connect_done) {
      link->connect_done = true;
      link->connect_status = status;
    }
  }
  dropped.clear();
  link->out.TakeAll();
  // Frames that arrived before the peer closed still reach the handler; a link closed here drops
  // them. Pending rendezvous receives return their buffers when they complete.
  if (bye) link->ready.clear();
  link->reorder.clear();
  ScheduleDeliver(link);
  if (link->ep == nullptr) return;
  absl::Time close_at = absl::Now();
  if (bye && could_bye) {
    // The peer learns at once; without it a closed shared-memory endpoint goes unnoticed.
    link->awaiting_bye_ack = true;
    PostAm(link, WireKind::kBye, Frame(), false);
    close_at += kByeBound;
  }
  closing_.push_back({link, close_at});
}

void Core::ProcessClosing(absl::Time now) {
  if (!closing_.empty()) {
    std::vector<Closing> due;
    std::vector<std::shared_ptr<LinkState>> acks;
    for (Closing& closing : closing_) {
      if (closing.link->ack_bye) {
        closing.link->ack_bye = false;
        closing.link->ack_pending = true;
        closing.close_at = now + kByeBound;
        acks.push_back(closing.link);
      }
    }
    // Posted here, outside ucp callbacks (the bye arrived in one).
    for (auto& link : acks) PostAm(link, WireKind::kByeAck, Frame(), false);
    for (size_t i = 0; i < closing_.size();) {
      const LinkState& link = *closing_[i].link;
      if ((!link.awaiting_bye_ack && !link.ack_pending) || now >= closing_[i].close_at) {
        due.push_back(std::move(closing_[i]));
        closing_[i] = std::move(closing_.back());
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    for (auto& closing : due) CloseEndpoint(closing.link);
  }
  for (size_t i = 0; i < close_requests_.size();) {
    if (ucp_request_check_status(close_requests_[i]) != UCS_INPROGRESS) {
      ucp_request_free(close_requests_[i]);
      close_requests_[i] = close_requests_.back();
      close_requests_.pop_back();
    } else {
      ++i;
    }
  }
}

void Core::CloseEndpoint(const std::shared_ptr<LinkState>& link) {
  ucp_ep_h ep = link->ep;
  if (ep == nullptr) return;
  link->ep = nullptr;
  eps_.erase(ep);
  // Forced: the bye told the peer already, and a flush could wait on a dead peer.
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &params);
  if (UCS_PTR_IS_PTR(request)) {
    close_requests_.push_back(request);
  } else if (UCS_PTR_IS_ERR(request)) {
    spdlog::debug("ucx: closing the endpoint to {}: {}", link->remote,
                  UcsError(UCS_PTR_STATUS(request)));
  }
}

void Core::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<Core*>(arg)->HandleEpError(ep, status);
}

void Core::HandleEpError(ucp_ep_h ep, ucs_status_t status) {
  auto it = eps_.find(ep);
  if (it == eps_.end()) return;  // already closed by us
  std::shared_ptr<LinkState> link = it->second;
  // Nothing more will come from or go to this peer: close without waiting for bye traffic.
  link->awaiting_bye_ack = false;
  link->ack_bye = false;
  link->ack_pending = false;
  spdlog::debug("ucx: {}: endpoint error {}", link->description, UcsError(status));
  if (link->phase == LinkState::Phase::kConnecting) {
    LinkDown(link, absl::UnavailableError(UcsError(status)), false);
  } else {
    LinkDown(link, absl::UnavailableError(absl::StrCat("peer lost: ", UcsError(status))), false);
  }
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* listener = static_cast<ListenerState*>(arg);
  // Endpoints are created outside the callback, in the loop.
  listener->core->conn_requests_.emplace_back(listener, request);
}

}  // namespace scd::transport::ucx_internal
