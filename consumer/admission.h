// Admission: a consumer reserves KV memory for a request before anything is sent to it (the
// producer starts streaming only to a consumer that admitted the request). A request's
// reservation is its whole future cache: (prompt + max_tokens) positions at the model's KV bytes
// per position, so a running sequence never outgrows what it was given. A request is admitted
// when its bytes fit the budget beside every reservation held and fewer than `capacity` requests
// hold one; otherwise it waits in a bounded FIFO (first come, first admitted: a large request at
// the head is not overtaken). Refused at once: a request larger than the whole budget
// (RESOURCE_EXHAUSTED naming the numbers), a full queue (RESOURCE_EXHAUSTED naming the queue),
// anything while draining (UNAVAILABLE). A waiting request leaves the queue when its deadline
// passes (DEADLINE_EXCEEDED) or its caller cancels (CANCELLED). A Reservation releases its
// bytes and place when destroyed, whichever way the request ended.
// A waiting request holds no thread (AdmitAsync): it is admitted by the thread that made room
// (a Reservation's release), and a timer of the Admission's clock (base/clock.h) ends its wait
// when its deadline passes. Admit is AdmitAsync waited for.
// Thread-safety: thread-safe.
#ifndef SCD_CONSUMER_ADMISSION_H_
#define SCD_CONSUMER_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/cancellation.h"
#include "base/clock.h"

namespace scd::consumer {

class Admission : public std::enable_shared_from_this<Admission> {
 public:
  struct Options {
    uint32_t capacity = 16;        // requests holding a reservation at once (an upper bound)
    int64_t budget_bytes = 0;      // KV memory for reservations; 0: no byte limit
    uint32_t max_queued = 256;     // requests waiting at once; 0: refuse instead of waiting
    Clock* clock = Clock::Real();  // deadlines and waited(); outlives the Admission
  };

  // What one admitted request holds; released on destruction.
  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    int64_t bytes() const { return bytes_; }
    absl::Duration waited() const { return waited_; }  // time in the queue

   private:
    friend class Admission;
    Reservation(std::shared_ptr<Admission> owner, int64_t bytes, absl::Duration waited)
        : owner_(std::move(owner)), bytes_(bytes), waited_(waited) {}
    std::shared_ptr<Admission> owner_;
    const int64_t bytes_;
    const absl::Duration waited_;
  };

  static std::shared_ptr<Admission> Create(Options options);
  // Capacity only: no byte budget, and full means refused (no queue).
  static std::shared_ptr<Admission> Create(uint32_t capacity);

  using Admitted = absl::StatusOr<std::unique_ptr<Reservation>>;
  // Reserves `bytes` (see the file comment), waiting in the queue while they do not fit; a
  // `cancellation` (may be null) that is cancelled meanwhile ends the wait at once (CANCELLED).
  Admitted Admit(int64_t bytes = 0, absl::Time deadline = absl::InfiniteFuture(),
                 Cancellation* cancellation = nullptr);
  // Admit without waiting: `done` is called once with the reservation or the refusal -- on this
  // thread when that is known at once, else on the thread that made room, cancelled, drained or
  // found the deadline passed. `cancellation` (may be null) outlives the call to `done`.
  // With IfFull::kRefuse a request that would have to wait is refused at once instead
  // (ABORTED, naming the numbers; nothing else answers ABORTED): an early prefill's request,
  // whose producer must not work for it before it holds a slot (consumer/served_request.h).
  enum class IfFull { kQueue, kRefuse };
  void AdmitAsync(int64_t bytes, absl::Time deadline, Cancellation* cancellation,
                  std::function<void(Admitted)> done, IfFull if_full = IfFull::kQueue);
  // Refuses every later Admit and every request still waiting (SIGTERM: drain what is running,
  // take nothing new).
  void Drain();
  // Waits until no request holds a reservation (the last release wakes it) or this Admission's
  // clock reaches `deadline`; returns whether none does. A drain's wait for running requests.
  bool AwaitIdle(absl::Time deadline) const;

  uint32_t active() const;         // requests holding a reservation
  uint32_t queued() const;         // requests waiting
  uint32_t most_queued() const;    // the most requests that waited at once so far
  int64_t queued_bytes() const;    // the bytes they wait for
  int64_t reserved_bytes() const;  // bytes the reservations hold
  int64_t free_bytes() const;      // budget - reserved (0 without a budget)
  uint32_t capacity() const { return options_.capacity; }
  int64_t budget_bytes() const { return options_.budget_bytes; }
  uint32_t max_queued() const { return options_.max_queued; }
  bool draining() const;

  ~Admission();  // ends the waits still queued (UNAVAILABLE)

 private:
  // A request in the queue.
  struct Waiter {
    uint64_t ticket = 0;
    int64_t bytes = 0;
    absl::Time arrived, deadline;
    std::function<void(Admitted)> done;
    Cancellation::Registration wake;  // leaves the queue when cancelled
    Clock::Timer expiry;              // leaves the queue at the deadline
  };
  // A wait that ended, told outside the lock.
  struct Outcome {
    std::shared_ptr<Waiter> waiter;
    Admitted result;
  };
  explicit Admission(Options options);
  bool Fits(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Reservation> Reserve(int64_t bytes, absl::Time arrived)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `waiter` out of the queue with `result` (into `ended`).
  void Dequeue(std::shared_ptr<Waiter> waiter, Admitted result, std::vector<Outcome>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admits the waiters at the head that fit now (first come, first admitted).
  void AdmitHead(std::vector<Outcome>* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the ended waits (no lock held: their callbacks may take it).
  static void Tell(std::vector<Outcome> ended);
  // Takes the waiter `ticket` (if still queued) out with why(it), read under the lock.
  void Leave(uint64_t ticket, const std::function<absl::Status(const Waiter&)>& why);
  // The waiter `ticket`'s deadline passed (its timer).
  void Expire(uint64_t ticket);
  void Release(int64_t bytes);

  const Options options_;
  mutable absl::Mutex mu_;
  uint32_t active_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<Waiter>> queue_ ABSL_GUARDED_BY(mu_);  // first come first
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t most_queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_ADMISSION_H_
