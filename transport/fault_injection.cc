#include "transport/fault_injection.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_name.h"

namespace scd::transport {

struct FaultInjectingLink::State {
  absl::Mutex mu;
  FaultPolicy policy ABSL_GUARDED_BY(mu);
  std::vector<int64_t> seen ABSL_GUARDED_BY(mu);  // matching frames so far, per rule
  bool frozen ABSL_GUARDED_BY(mu) = false;
  FaultCounters counters ABSL_GUARDED_BY(mu);
  LinkHandler* handler ABSL_GUARDED_BY(mu) = nullptr;
  int delayed_in_flight ABSL_GUARDED_BY(mu) = 0;
  bool closing ABSL_GUARDED_BY(mu) = false;
};

namespace {

// What to do with one frame, decided under the lock.
struct Decision {
  bool drop = false, corrupt = false, disconnect = false;
  absl::Duration delay = absl::ZeroDuration();
  size_t corrupt_offset = 0;
};

}  // namespace

FaultInjectingLink::FaultInjectingLink(std::unique_ptr<Link> inner, FaultPolicy policy)
    : LinkWrapper(std::move(inner)), state_(std::make_shared<State>()) {
  absl::MutexLock lock(&state_->mu);
  state_->seen.assign(policy.rules.size(), 0);
  state_->policy = std::move(policy);
}

FaultInjectingLink::~FaultInjectingLink() {
  Close();
  // Delayed frames hold a reference to the state, never to this object's inner link directly
  // after closing; wait for them so nothing runs after destruction.
  absl::MutexLock lock(&state_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    return state_->delayed_in_flight == 0;
  };
  state_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  state_->mu.Unlock();
  DestroyInner();  // joins its delivery, which calls back into this object: before members go
  state_->mu.Lock();
}

namespace {
Decision DecideLocked(FaultPolicy& policy, std::vector<int64_t>& seen, bool& frozen,
                      FaultCounters& counters, FaultDirection direction, const Frame& frame) {
  Decision d;
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    const FaultRule& rule = policy.rules[i];
    if (rule.direction != direction) continue;
    if (rule.type.has_value() && *rule.type != frame.type) continue;
    const int64_t n = seen[i]++;
    if (n < rule.nth || n >= rule.nth + rule.count) continue;
    switch (rule.action) {
      case FaultAction::kDrop:
        d.drop = true;
        break;
      case FaultAction::kDelay:
        d.delay = std::max(d.delay, rule.delay);
        break;
      case FaultAction::kCorrupt:
        d.corrupt = !frame.payload.empty();
        d.corrupt_offset = rule.corrupt_offset;
        break;
      case FaultAction::kDisconnect:
        d.disconnect = true;
        break;
      case FaultAction::kFreeze:
        frozen = true;
        break;
    }
  }
  if (frozen) {
    ++counters.frozen_frames;
    d.drop = true;
  }
  if (d.drop && !frozen) ++counters.dropped;
  if (d.corrupt) ++counters.corrupted;
  if (d.delay > absl::ZeroDuration()) ++counters.delayed;
  if (d.disconnect) ++counters.disconnects;
  return d;
}

Frame Corrupted(Frame frame, size_t offset) {
  Payload copy = Payload::Copy(frame.payload.data(), frame.payload.size());
  const_cast<uint8_t*>(copy.data())[offset % copy.size()] ^= 0x5A;
  frame.payload = std::move(copy);
  frame.payload_crc.reset();  // damaged after any checksum the backend took
  return frame;
}
}  // namespace

void FaultInjectingLink::Start(LinkHandler* handler) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->handler = handler;
  }
  LinkWrapper::Start(this);
}

absl::Status FaultInjectingLink::Send(Frame frame) {
  Decision d;
  {
    absl::MutexLock lock(&state_->mu);
    d = DecideLocked(state_->policy, state_->seen, state_->frozen, state_->counters,
                     FaultDirection::kOutgoing, frame);
    if (d.delay > absl::ZeroDuration() && !d.drop) ++state_->delayed_in_flight;
  }
  if (d.disconnect) {
    inner().Close();
    return absl::OkStatus();
  }
  if (d.drop) return absl::OkStatus();
  if (d.corrupt) frame = Corrupted(std::move(frame), d.corrupt_offset);
  if (d.delay > absl::ZeroDuration()) {
    Link* inner = &this->inner();
    std::shared_ptr<State> state = state_;
    std::thread([state, inner, delay = d.delay, frame = std::move(frame)]() mutable {
      NameThisThread("scd-fault-delay");
      absl::SleepFor(delay);
      absl::MutexLock lock(&state->mu);
      if (!state->closing) inner->Send(std::move(frame)).IgnoreError();
      --state->delayed_in_flight;
    }).detach();
    return absl::OkStatus();
  }
  return LinkWrapper::Send(std::move(frame));
}

void FaultInjectingLink::OnFrame(Frame frame) {
  Decision d;
  LinkHandler* handler;
  {
    absl::MutexLock lock(&state_->mu);
    d = DecideLocked(state_->policy, state_->seen, state_->frozen, state_->counters,
                     FaultDirection::kIncoming, frame);
    handler = state_->handler;
  }
  if (d.disconnect) {
    inner().Close();
    return;
  }
  if (d.drop || handler == nullptr) return;
  if (d.corrupt) frame = Corrupted(std::move(frame), d.corrupt_offset);
  // Incoming delays hold up this link's delivery thread, which delays every later frame too:
  // that is what a slow network does to a stream.
  if (d.delay > absl::ZeroDuration()) absl::SleepFor(d.delay);
  handler->OnFrame(std::move(frame));
}

void FaultInjectingLink::OnLinkDown(absl::Status status) {
  LinkHandler* handler;
  {
    absl::MutexLock lock(&state_->mu);
    handler = state_->handler;
  }
  if (handler != nullptr) handler->OnLinkDown(std::move(status));
}

void FaultInjectingLink::Close() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->closing = true;
  }
  LinkWrapper::Close();
}

std::string FaultInjectingLink::Describe() const {
  return absl::StrCat(LinkWrapper::Describe(), " (fault injection)");
}

FaultCounters FaultInjectingLink::counters() const {
  absl::MutexLock lock(&state_->mu);
  return state_->counters;
}

void FaultInjectingLink::SetFrozen(bool frozen) {
  absl::MutexLock lock(&state_->mu);
  state_->frozen = frozen;
}

}  // namespace scd::transport
