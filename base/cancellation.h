// One request's cancellation, propagated by callbacks rather than found by polling. Whoever
// learns that the request ends early (its caller went away, its deadline, shutdown, a peer lost)
// calls Cancel once with why; whoever holds something the request must give back (a wait in the
// admission queue, a transfer session, the producer's prefill) registers a callback that gives it
// back, and is woken at once. Envoy's and Dynamo's cancellation tokens work so.
//
//   Cancellation cancel;                                   // one per request
//   Cancellation::Registration r = cancel.OnCancel(
//       [&](const absl::Status& why) { session->Cancel(std::string(why.message())); });
//   ... cancel.Cancel(absl::CancelledError("the client went away"));  // from any thread
//
// The first Cancel wins; every callback registered before it runs once, on the cancelling thread,
// after Cancel's state is visible (cancelled() is true inside a callback); one registered after it
// runs at once on the registering thread. Destroying (or Reset-ting) a Registration unregisters
// its callback: once that returns, the callback neither runs nor is running, unless it is the
// running callback's own thread that unregisters (it may, and does not wait for itself).
// Callbacks must not block for long: the cancelling thread runs them one after another.
// Thread-safety: thread-safe.
#ifndef SCD_BASE_CANCELLATION_H_
#define SCD_BASE_CANCELLATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace scd {

class Cancellation {
 public:
  using Callback = std::function<void(const absl::Status& why)>;

  // Unregisters its callback when destroyed or Reset (see above). Movable.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration() { Reset(); }
    void Reset();

   private:
    friend class Cancellation;
    Registration(Cancellation* owner, uint64_t id) : owner_(owner), id_(id) {}
    Cancellation* owner_ = nullptr;
    uint64_t id_ = 0;
  };

  Cancellation() = default;
  // REQUIRES: no Registration of it outlives it.
  ~Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Cancels with `why` (an OK status reads as CANCELLED); false when it was cancelled already.
  bool Cancel(absl::Status why);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // OK until cancelled; then why.
  absl::Status status() const;
  // The flag for code that looks between steps (the decode scheduler): true once cancelled.
  const std::atomic<bool>* flag() const { return &cancelled_; }
  // Runs `callback` once when cancelled (at once, here, if it is already).
  [[nodiscard]] Registration OnCancel(Callback callback);
  // Blocks until cancelled or `clock` reaches `deadline`; true when cancelled.
  bool WaitUntil(absl::Time deadline, Clock* clock = Clock::Real()) const;

 private:
  void Unregister(uint64_t id);

  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  bool cancelled_locked_ ABSL_GUARDED_BY(mu_) = false;  // cancelled_, as the lock sees it
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Callback> callbacks_ ABSL_GUARDED_BY(mu_);
  // The callback Cancel is running (0: none) and its thread, so an unregistering thread waits
  // for it (another thread) or not (the callback's own).
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread::id running_thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_CANCELLATION_H_
