// Both ends of an in-process link share one Pipe: a LaneQueue per direction (control frames ahead
// of queued data, a cancelled session's data droppable) and a delivery thread per end, so a
// handler never runs on the sender's stack (no re-entrancy between the two ends' locks). Each end
// delivers through a DeliveryGate (held until Start, one link-down, no exception escapes).
// Payloads move as they are: the receiver gets the sender's view and owner.
#include "transport/inproc/inproc_transport.h"

#include <deque>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/delivery_gate.h"
#include "transport/lane_queue.h"

namespace scd::transport {
namespace {

struct Pipe {
  explicit Pipe(std::string pipe_name) : name(std::move(pipe_name)) {}
  absl::Mutex mu;
  LaneQueue<Frame> queue[2] ABSL_GUARDED_BY(mu);  // frames waiting for end i's handler
  bool closed ABSL_GUARDED_BY(mu) = false;
  int closed_by ABSL_GUARDED_BY(mu) = -1;
  const std::string name;
};

class InProcessLink : public Link {
 public:
  InProcessLink(std::shared_ptr<Pipe> pipe, int side)
      : pipe_(std::move(pipe)),
        side_(side),
        gate_(absl::StrCat("inproc ", pipe_->name)),
        thread_([this] { DeliveryLoop(); }) {}
  ~InProcessLink() override {
    Close();
    thread_.join();
  }

  void Start(LinkHandler* handler) override { gate_.Start(handler); }

  absl::Status Send(Frame frame) override {
    absl::MutexLock lock(&pipe_->mu);
    if (pipe_->closed) return absl::FailedPreconditionError("in-process link is closed");
    pipe_->queue[1 - side_].Push(std::move(frame));
    return absl::OkStatus();
  }

  void Close() override {
    std::deque<Frame> released[2];  // payloads go after the unlock
    {
      absl::MutexLock lock(&pipe_->mu);
      if (!pipe_->closed) {
        pipe_->closed = true;
        pipe_->closed_by = side_;
        released[0] = pipe_->queue[0].TakeAll();
        released[1] = pipe_->queue[1].TakeAll();
      }
    }
    // This end's handler hears it before Close returns (after the handler call in progress, when
    // a handler closes its own link).
    gate_.Down(absl::CancelledError("link closed"), /*drop_held=*/true);
  }

  void DropSession(uint64_t session_id) override {
    std::deque<Frame> dropped;  // declared first: released after the unlock
    absl::MutexLock lock(&pipe_->mu);
    dropped = pipe_->queue[1 - side_].DropSession(session_id);
  }

  std::string Describe() const override { return gate_.description(); }

 private:
  void DeliveryLoop() {
    for (;;) {
      Frame frame;
      {
        absl::MutexLock lock(&pipe_->mu);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipe_->mu) {
          return pipe_->closed || !pipe_->queue[side_].empty();
        };
        pipe_->mu.Await(absl::Condition(&ready));
        if (pipe_->closed) {
          const bool by_me = pipe_->closed_by == side_;
          pipe_->mu.Unlock();
          gate_.Down(by_me ? absl::CancelledError("link closed")
                           : absl::UnavailableError("peer closed the link"),
                     /*drop_held=*/by_me);
          pipe_->mu.Lock();
          return;
        }
        frame = *pipe_->queue[side_].Pop();
      }
      gate_.Deliver(std::move(frame));
    }
  }

  std::shared_ptr<Pipe> pipe_;
  const int side_;
  DeliveryGate gate_;
  std::thread thread_;  // last: starts once everything else is ready
};

class InProcessListener;

// Process-wide table of listening names.
struct Registry {
  absl::Mutex mu;
  std::map<std::string, InProcessListener*> listeners ABSL_GUARDED_BY(mu);
  int64_t next_id ABSL_GUARDED_BY(mu) = 1;
};
Registry& GlobalRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

class InProcessListener : public Listener {
 public:
  explicit InProcessListener(std::string name) : name_(std::move(name)) {}
  ~InProcessListener() override { Close(); }

  absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto ready = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !pending_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no connection on ", name_));
    }
    if (closed_) return absl::CancelledError(absl::StrCat("listener ", name_, " closed"));
    std::unique_ptr<Link> link = std::move(pending_.front());
    pending_.pop_front();
    return link;
  }

  std::string address() const override { return name_; }

  void Close() override {
    {
      Registry& registry = GlobalRegistry();
      absl::MutexLock lock(&registry.mu);
      auto it = registry.listeners.find(name_);
      if (it != registry.listeners.end() && it->second == this) registry.listeners.erase(it);
    }
    std::deque<std::unique_ptr<Link>> unaccepted;  // declared first: closed after the unlock
    absl::MutexLock lock(&mu_);
    closed_ = true;
    unaccepted.swap(pending_);
  }

  // Called with the registry lock held, so the listener cannot go away meanwhile.
  bool Offer(std::unique_ptr<Link> link) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    pending_.push_back(std::move(link));
    return true;
  }

 private:
  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Link>> pending_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class InProcessTransport : public Transport {
 public:
  InProcessTransport() {
    capabilities_.backend = "inproc";
    capabilities_.zero_copy_send = true;
    capabilities_.devices = {"memory"};
  }
  const Capabilities& capabilities() const override { return capabilities_; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    Registry& registry = GlobalRegistry();
    absl::MutexLock lock(&registry.mu);
    std::string name = address;
    if (name.empty() || name == "0" || absl::EndsWith(name, ":0")) {
      name = absl::StrCat(name.empty() ? "inproc" : name, "#", registry.next_id++);
    }
    if (registry.listeners.count(name) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("in-process address '", name, "' in use"));
    }
    auto listener = std::make_unique<InProcessListener>(name);
    registry.listeners[name] = listener.get();
    return std::unique_ptr<Listener>(std::move(listener));
  }

  absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                absl::Duration) override {
    Registry& registry = GlobalRegistry();
    absl::MutexLock lock(&registry.mu);
    auto it = registry.listeners.find(address);
    if (it == registry.listeners.end()) {
      return absl::UnavailableError(
          absl::StrCat("nothing listens on in-process address '", address, "'"));
    }
    auto pipe = std::make_shared<Pipe>(address);
    if (!it->second->Offer(std::make_unique<InProcessLink>(pipe, 1))) {
      return absl::UnavailableError(absl::StrCat("listener '", address, "' closed"));
    }
    return std::unique_ptr<Link>(std::make_unique<InProcessLink>(pipe, 0));
  }

 private:
  Capabilities capabilities_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewInProcessTransport(const TransportOptions&) {
  return std::unique_ptr<Transport>(std::make_unique<InProcessTransport>());
}

}  // namespace scd::transport
