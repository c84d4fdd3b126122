// The UCX core's context, worker and progress loop. While there is work (or transfers are in
// flight and progress was made in the last kSpinWindow) the thread loops on ucp_worker_progress
// without sleeping; otherwise it arms the worker and polls its event fd (100 ms at most), so an
// idle transport does not spin a core.
//
// Receiving: rendezvous data lands in buffers of a ReceivePool registered once with ucp_mem_map
// (so ucp need not register per receive); beyond its cap, an unregistered counted buffer.
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_core.h"

namespace scd::transport::ucx_internal {
namespace {

// Receive buffers registered with the context; at most 1 GiB of them.
ReceivePool::Options RegisteredPoolOptions(ucp_context_h context) {
  ReceivePool::Options options;
  options.max_mapped_bytes = size_t{1} << 30;
  options.min_pooled_bytes = 0;  // only rendezvous receives (>= the threshold) ask
  options.register_memory = [context](void* data, size_t bytes) -> void* {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = data;
    params.length = bytes;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(context, &params, &memh);
    if (status != UCS_OK) {
      spdlog::warn("ucx: ucp_mem_map of {} bytes failed: {}", bytes, UcsError(status));
      return nullptr;
    }
    return memh;
  };
  options.unregister_memory = [context](void* handle) {
    ucp_mem_unmap(context, static_cast<ucp_mem_h>(handle));
  };
  return options;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Core>> Core::Create(const TransportOptions& options) {
  std::shared_ptr<Core> core(new Core(options));
  absl::Status status = core->Init();
  if (!status.ok()) return status;
  return core;
}

absl::Status Core::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);  // honours UCX_* variables
  if (status != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucx: ucp_config_read: ", UcsError(status)));
  }
  ConfigureContext(config, options_);
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = "scd";
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ucp_init: ", UcsError(status)));
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    ucp_cleanup(context_);
    context_ = nullptr;
    worker_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ucp_worker_create: ", UcsError(status)));
  }
  auto fail = [this](const std::string& what, ucs_status_t s) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ", what, ": ", UcsError(s)));
  };
  status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) return fail("ucp_worker_get_efd", status);

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  status = ucp_worker_query(worker_, &attr);
  size_t max_header = status == UCS_OK ? attr.max_am_header : 1024;
  max_inline_meta_ = max_header > sizeof(WireHeader) ? max_header - sizeof(WireHeader) : 0;

  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kAmId;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = &Core::OnAm;
  handler.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &handler);
  if (status != UCS_OK) return fail("ucp_worker_set_am_recv_handler", status);

  pool_ = ReceivePool::Create(RegisteredPoolOptions(context_));

  std::vector<std::string> transports = ContextTransports(context_);
  capabilities_.backend = "ucx";
  capabilities_.cross_process = true;
  capabilities_.zero_copy_send = true;
  capabilities_.max_message_bytes = 0;
  capabilities_.devices = transports;
  FillCapabilities(transports, &capabilities_);
  devices_text_ = absl::StrJoin(transports, ",");

  absl::Notification started;
  thread_ = std::thread([this, &started] {
    thread_id_ = std::this_thread::get_id();
    started.Notify();
    Loop();
  });
  started.WaitForNotification();
  spdlog::debug("ucx: transport up (transports {}, max inline meta {} bytes)", devices_text_,
                max_inline_meta_);
  return absl::OkStatus();
}

bool Core::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  // One signal per batch: the loop takes both queues at once, so a non-empty queue already has a
  // wakeup pending. Signalled under the lock so Shutdown cannot destroy the worker meanwhile.
  const bool wake = commands_.empty() && ready_links_.empty();
  commands_.push_back(std::move(fn));
  if (wake) ucp_worker_signal(worker_);
  return true;
}

bool Core::RunAndWait(std::function<void()> fn, absl::Duration bound) {
  if (OnProgressThread()) {
    fn();
    return true;
  }
  auto done = std::make_shared<absl::Notification>();
  if (!Post([fn = std::move(fn), done] {
        fn();
        done->Notify();
      })) {
    return false;
  }
  return done->WaitForNotificationWithTimeout(bound);
}

void Core::Shutdown() {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  if (worker_ == nullptr) {  // Init failed before the thread started
    shut_down_ = true;
    return;
  }
  if (OnProgressThread()) {
    spdlog::error("ucx: the transport must not be destroyed from a link handler; leaking it");
    return;
  }
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    ucp_worker_signal(worker_);
  }
  thread_.join();

  // The thread is gone; this thread now owns the worker.
  for (void* request : close_requests_) ucp_request_free(request);
  close_requests_.clear();
  eps_.clear();
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  // Operations ucp never completed: their requests went with the worker; release what they hold.
  for (auto& op : send_ops_.all()) {
    if (op->in_flight) {
      op->in_flight = false;
      op->frame = Frame();
      op->bounce.Reset();
      op->link.reset();
    }
  }
  for (auto& op : recv_ops_.all()) {
    if (op->in_flight) {
      op->in_flight = false;
      if (op->buffer != nullptr) pool_->Give(op->buffer);
      op->buffer = nullptr;
      op->fallback.Reset();
      op->link.reset();
    }
  }
  pool_->Shutdown();
  ucp_cleanup(context_);
  context_ = nullptr;
  deliver_list_.clear();
  pump_list_.clear();
  hellos_.clear();
  handshaking_.clear();
  closing_.clear();
  listeners_.clear();
}

void Core::Loop() {
  pthread_setname_np(pthread_self(), "scd-ucx");
  absl::Time stop_deadline = absl::InfiniteFuture();
  for (;;) {
    bool worked = TakeCommands();
    if (!stopping_) {
      absl::MutexLock lock(&mu_);
      stopping_ = stopped_;
    }
    if (stopping_ && stop_deadline == absl::InfiniteFuture()) {
      BeginShutdown();
      stop_deadline = absl::Now() + kShutdownBound;
    }
    worked |=
        !conn_requests_.empty() || !hellos_.empty() || !hello_acks_.empty() || !pump_list_.empty();
    ProcessConnRequests();
    ProcessHellos();
    ProcessHelloAcks();
    ProcessPumps();
    const unsigned events = ucp_worker_progress(worker_);
    worked |= !deliver_list_.empty();
    DeliverAll();
    const absl::Time now = absl::Now();
    if (!closing_.empty() || !close_requests_.empty()) ProcessClosing(now);
    if (!handshaking_.empty() && now >= next_handshake_check_) {
      CheckHandshakes(now);
      next_handshake_check_ = now + absl::Milliseconds(100);
    }
    if (stopping_ && (Quiescent() || now >= stop_deadline)) {
      // Commands posted just before the stop still run (they see stopping_ and give up).
      if (TakeCommands()) {
        DeliverAll();
        continue;
      }
      if (!Quiescent()) {
        spdlog::warn("ucx: shutdown bound reached with {} sends and {} receives in flight",
                     send_ops_in_flight_, recv_ops_in_flight_);
      }
      DrainWorker();
      break;
    }
    // Busy (something happened, or transfers are in flight and something happened lately):
    // progress again at once, since waking from the event fd costs each rendezvous round trip
    // tens of microseconds. Idle: sleep on the event fd. The spin window stops a stalled peer
    // from keeping this thread at 100 % while our sends wait on it.
    if (events > 0 || worked) {
      last_event_ = now;
      continue;
    }
    if ((send_ops_in_flight_ > 0 || recv_ops_in_flight_ > 0) && now - last_event_ < kSpinWindow) {
      continue;
    }
    Idle();
  }
}

bool Core::TakeCommands() {
  std::deque<std::function<void()>> commands;
  std::vector<std::shared_ptr<LinkState>> links;
  {
    absl::MutexLock lock(&mu_);
    if (commands_.empty() && ready_links_.empty()) return false;
    commands.swap(commands_);
    links.swap(ready_links_);
  }
  for (auto& command : commands) command();
  for (auto& link : links) {
    std::deque<Frame> frames;  // control frames first, then data in order
    {
      absl::MutexLock lock(&link->mu);
      link->queued = false;
      frames = link->inbox.TakeAll();
    }
    if (link->phase != LinkState::Phase::kUp) continue;  // down (or never up): released here
    for (Frame& frame : frames) link->out.Push(std::move(frame));
    SchedulePump(link);
  }
  return true;
}

void Core::Idle() {
  ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  int timeout_ms = kIdlePollMs;
  // Shorter while something is pending: closing deadlines, and transfers whose completion should
  // not hinge on a single wakeup.
  if (!closing_.empty() || !close_requests_.empty() || stopping_ || send_ops_in_flight_ > 0 ||
      recv_ops_in_flight_ > 0) {
    timeout_ms = kTimerPollMs;
  }
  if (status != UCS_OK) {
    spdlog::warn("ucx: ucp_worker_arm: {}", UcsError(status));
    timeout_ms = 1;
  }
  pollfd fd{};
  fd.fd = event_fd_;
  fd.events = POLLIN;
  poll(&fd, 1, timeout_ms);
}

void Core::BeginShutdown() {
  for (auto& listener : std::vector<std::shared_ptr<ListenerState>>(listeners_)) {
    {
      absl::MutexLock lock(&listener->mu);
      listener->closed = true;
    }
    CloseListenerNow(listener);
  }
  std::vector<std::shared_ptr<LinkState>> links;
  links.reserve(eps_.size());
  for (auto& [ep, link] : eps_) links.push_back(link);
  for (auto& link : links) {
    LinkDown(link, absl::CancelledError("ucx transport shut down"), /*bye=*/true);
  }
  DeliverAll();
}

void Core::DrainWorker() {
  // Our requests are done, but ucp may still hold work it deferred (purging the pending queue of
  // a force-closed endpoint, a rendezvous completion message): UCX 1.13 asserts in
  // ucp_worker_destroy when a cma endpoint still has queued work. Progress until ucp reports
  // nothing for a while (bounded).
  const absl::Time end = absl::Now() + absl::Milliseconds(200);
  int quiet_rounds = 0;
  while (quiet_rounds < 100 && absl::Now() < end) {
    quiet_rounds = ucp_worker_progress(worker_) > 0 ? 0 : quiet_rounds + 1;
  }
}

bool Core::Quiescent() const {
  return closing_.empty() && close_requests_.empty() && send_ops_in_flight_ == 0 &&
         recv_ops_in_flight_ == 0;
}

}  // namespace scd::transport::ucx_internal
