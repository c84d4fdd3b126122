// consumer::Admission: KV memory and a place are reserved before work starts and released by
// whatever ends the request; requests that do not fit wait in a FIFO (first come, first admitted,
// none overtaking a large one at the head) and leave it at their deadline or cancel; a request
// larger than the budget and a full queue are refused at once naming the numbers; draining refuses
// new and waiting work and keeps running work. Without a queue (max_queued 0) full refuses early.
// Waits are judged on a simulated clock (base/simulated_clock.h) and through AdmitAsync, whose
// queueing is done when it returns: no sleeps, no wall-clock bounds.
#include "consumer/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/simulated_clock.h"

namespace scd::consumer {
namespace {

using ::testing::HasSubstr;

TEST(AdmissionTest, FullRefusesEarlyAndSlotsReleaseOnDestruction) {
  auto admission = Admission::Create(2);
  auto a = admission->Admit();
  auto b = admission->Admit();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(admission->active(), 2u);
  auto c = admission->Admit();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("2 of 2"));
  a->reset();  // a request ended (any way): its place is free again
  EXPECT_EQ(admission->active(), 1u);
  EXPECT_TRUE(admission->Admit().ok());  // admitted and released at once (temporary)
  EXPECT_EQ(admission->active(), 1u);
}

TEST(AdmissionTest, ConcurrentAdmitsNeverExceedCapacity) {
  auto admission = Admission::Create(3);
  std::atomic<int> admitted{0}, refused{0}, peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto slot = admission->Admit();
        if (!slot.ok()) {
          ++refused;
          continue;
        }
        ++admitted;
        int now = static_cast<int>(admission->active());
        int seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(peak.load(), 3);
  EXPECT_EQ(admitted + refused, 16000);
  EXPECT_EQ(admission->active(), 0u);
}

TEST(AdmissionTest, DrainingRefusesNewWorkAndKeepsRunningWork) {
  auto admission = Admission::Create(4);
  auto running = admission->Admit();
  ASSERT_TRUE(running.ok());
  admission->Drain();
  EXPECT_TRUE(admission->draining());
  EXPECT_EQ(admission->Admit().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admission->active(), 1u);
  running->reset();
  EXPECT_EQ(admission->active(), 0u);
}

Admission::Options Budget(int64_t bytes, uint32_t capacity = 16, uint32_t queue = 8,
                          Clock* clock = Clock::Real()) {
  Admission::Options options;
  options.budget_bytes = bytes;
  options.capacity = capacity;
  options.max_queued = queue;
  options.clock = clock;
  return options;
}

// An AdmitAsync's outcome, once told.
struct Told {
  std::optional<Admission::Admitted> result;
  std::function<void(Admission::Admitted)> Setter() {
    return [this](Admission::Admitted r) { result = std::move(r); };
  }
  bool ok() const { return result.has_value() && result->ok(); }
  absl::StatusCode code() const {
    return result.has_value() ? result->status().code() : absl::StatusCode::kUnknown;
  }
  std::string message() const {
    return result.has_value() ? std::string(result->status().message()) : "(not told)";
  }
};

TEST(AdmissionTest, BytesAreReservedAndTooLargeARequestIsRefusedAtOnce) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(1000, 16, 8, &clock));
  auto a = admission->Admit(600);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(admission->reserved_bytes(), 600);
  EXPECT_EQ(admission->free_bytes(), 400);
  EXPECT_EQ((*a)->bytes(), 600);
  // A wait for room would last until this deadline; a request that can never fit is told before
  // AdmitAsync returns, with the clock standing still.
  Told huge;
  admission->AdmitAsync(1001, clock.Now() + absl::Seconds(10), nullptr, huge.Setter());
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.message(), HasSubstr("needs 1001 bytes"));
  EXPECT_THAT(huge.message(), HasSubstr("budget of 1000 bytes"));
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(clock.pending(), 0u);  // no deadline timer was set
  a->reset();
  EXPECT_EQ(admission->reserved_bytes(), 0);
}

// IfFull::kRefuse (an early prefill's request): admitted when it fits now, else refused at once
// (ABORTED) without a place in the queue or a timer -- also when it would fit but others wait.
TEST(AdmissionTest, ARequestThatMustNotWaitIsRefusedInsteadOfQueued) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(1000, 16, 8, &clock));
  using IfFull = Admission::IfFull;
  Told fits;
  admission->AdmitAsync(600, clock.Now() + absl::Seconds(10), nullptr, fits.Setter(),
                        IfFull::kRefuse);
  ASSERT_TRUE(fits.ok()) << fits.message();
  Told full;
  admission->AdmitAsync(500, clock.Now() + absl::Seconds(10), nullptr, full.Setter(),
                        IfFull::kRefuse);
  EXPECT_EQ(full.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(full.message(), HasSubstr("it would wait"));
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(clock.pending(), 0u);
  Told queued;  // the same request that may wait does
  admission->AdmitAsync(500, clock.Now() + absl::Seconds(10), nullptr, queued.Setter());
  EXPECT_FALSE(queued.result.has_value());
  EXPECT_EQ(admission->queued(), 1u);
  Told behind;  // 100 fits beside the 600, but the queue's head comes first
  admission->AdmitAsync(100, clock.Now() + absl::Seconds(10), nullptr, behind.Setter(),
                        IfFull::kRefuse);
  EXPECT_EQ(behind.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(admission->queued(), 1u);
  fits.result->value().reset();  // the head is admitted
  EXPECT_TRUE(queued.ok()) << queued.message();
}

TEST(AdmissionTest, WaitersAreAdmittedFirstComeFirstAsBytesFree) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(1000, 16, 8, &clock));
  auto held = admission->Admit(900);
  ASSERT_TRUE(held.ok());
  // 500 first, then two of 50: the small ones would fit beside the held 900 but wait behind the
  // 500 at the head.
  Told told[3];
  const int64_t sizes[] = {500, 50, 50};
  for (int i = 0; i < 3; ++i) {
    admission->AdmitAsync(sizes[i], absl::InfiniteFuture(), nullptr, told[i].Setter());
    clock.Advance(absl::Milliseconds(10));
  }
  EXPECT_EQ(admission->queued(), 3u);  // nobody overtook the 500
  for (const Told& t : told) EXPECT_FALSE(t.result.has_value());
  EXPECT_EQ(admission->reserved_bytes(), 900);
  EXPECT_EQ(admission->queued_bytes(), 600);
  held->reset();  // 1000 free: all three fit, admitted by this thread's release
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(told[i].ok()) << told[i].message();
    EXPECT_EQ((**told[i].result)->waited(), absl::Milliseconds(30 - 10 * i));  // on the clock
  }
  EXPECT_EQ(admission->reserved_bytes(), 600);
  EXPECT_EQ(admission->active(), 3u);
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(admission->queued_bytes(), 0);
}

TEST(AdmissionTest, AFullQueueRefusesAtOnceNamingIt) {
  auto admission = Admission::Create(Budget(100, 16, /*queue=*/2));
  auto held = admission->Admit(100);
  Told waiting[2];
  for (Told& w : waiting) admission->AdmitAsync(10, absl::InfiniteFuture(), nullptr, w.Setter());
  EXPECT_EQ(admission->queued(), 2u);
  auto refused = admission->Admit(10);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("queue holds 2 of 2"));
  held->reset();
  for (const Told& w : waiting) EXPECT_TRUE(w.ok()) << w.message();
}

TEST(AdmissionTest, CapacityBoundsRequestsEvenWhenBytesFit) {
  auto admission = Admission::Create(Budget(1 << 20, /*capacity=*/2));
  auto a = admission->Admit(1), b = admission->Admit(1);
  Told third;
  admission->AdmitAsync(1, absl::InfiniteFuture(), nullptr, third.Setter());
  EXPECT_EQ(admission->queued(), 1u);
  EXPECT_EQ(admission->active(), 2u);
  a->reset();
  EXPECT_TRUE(third.ok()) << third.message();
}

TEST(AdmissionTest, AWaiterLeavesAtItsDeadlineOrCancelAndTheNextGoesOn) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(100, 16, 8, &clock));
  auto held = admission->Admit(100);
  Cancellation cancel;
  Told expired, cancelled, last;
  admission->AdmitAsync(10, clock.Now() + absl::Milliseconds(60), nullptr, expired.Setter());
  admission->AdmitAsync(10, absl::InfiniteFuture(), &cancel, cancelled.Setter());
  EXPECT_EQ(admission->queued(), 2u);
  clock.Advance(absl::Milliseconds(59));
  EXPECT_FALSE(expired.result.has_value());  // not before its deadline
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(expired.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(expired.message(), HasSubstr("passed after 60ms waiting for KV memory"));
  EXPECT_EQ(admission->queued(), 1u);
  cancel.Cancel(absl::CancelledError("the caller went away"));
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(admission->queued_bytes(), 0);
  // A waiter admitted before its deadline leaves no timer behind.
  admission->AdmitAsync(100, clock.Now() + absl::Seconds(1), nullptr, last.Setter());
  EXPECT_EQ(clock.pending(), 1u);
  held->reset();
  EXPECT_TRUE(last.ok()) << last.message();
  EXPECT_EQ(clock.pending(), 0u);
}

TEST(AdmissionTest, DrainingAndDestructionEndWaitingRequests) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(100, 16, 8, &clock));
  auto held = admission->Admit(100);
  Told drained;
  admission->AdmitAsync(10, clock.Now() + absl::Seconds(1), nullptr, drained.Setter());
  admission->Drain();
  EXPECT_EQ(drained.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admission->active(), 1u);
  EXPECT_EQ(clock.pending(), 0u);
  // Destroyed with a request waiting (capacity 0: nothing is ever admitted): told UNAVAILABLE,
  // its timer cancelled.
  auto closed = Admission::Create(Budget(100, /*capacity=*/0, 8, &clock));
  Told waiting;
  closed->AdmitAsync(10, clock.Now() + absl::Seconds(1), nullptr, waiting.Setter());
  EXPECT_EQ(closed->queued(), 1u);
  EXPECT_EQ(clock.pending(), 1u);
  closed.reset();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kUnavailable) << waiting.message();
  EXPECT_EQ(clock.pending(), 0u);
  clock.Advance(absl::Seconds(2));  // nothing fires into the destroyed Admission
}

// A drain's wait for running requests: woken by the last release with the clock standing still,
// or ended by its deadline (exactly: not 1 us before).
TEST(AdmissionTest, AwaitIdleEndsAtTheLastReleaseOrItsDeadline) {
  SimulatedClock clock;
  auto admission = Admission::Create(Budget(100, 16, 8, &clock));
  EXPECT_TRUE(admission->AwaitIdle(clock.Now()));  // nothing held: at once
  auto held = admission->Admit(60);
  ASSERT_TRUE(held.ok());
  std::atomic<int> idle{-1};
  std::thread waiter([&] { idle = admission->AwaitIdle(clock.Now() + absl::Seconds(1)); });
  clock.AwaitPending(1);  // the wait is parked on the clock
  clock.Advance(absl::Seconds(1) - absl::Microseconds(1));
  EXPECT_EQ(clock.pending(), 1u) << "the wait ended before its deadline";
  clock.Advance(absl::Microseconds(1));
  waiter.join();
  EXPECT_EQ(idle.load(), 0) << "the deadline did not end the wait";
  std::thread released([&] { idle = admission->AwaitIdle(clock.Now() + absl::Seconds(1)); });
  clock.AwaitPending(1);
  held->reset();
  released.join();
  EXPECT_EQ(idle.load(), 1) << "the last release did not wake the wait";
}

}  // namespace
}  // namespace scd::consumer
