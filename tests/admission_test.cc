// consumer::Admission: KV memory and a place are reserved before work starts and released by
// whatever ends the request; requests that do not fit wait in a FIFO (first come, first admitted,
// none overtaking a large one at the head) and leave it at their deadline or cancel; a request
// larger than the budget and a full queue are refused at once naming the numbers; draining refuses
// new and waiting work and keeps running work. Without a queue (max_queued 0) full refuses early.
#include "consumer/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

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

Admission::Options Budget(int64_t bytes, uint32_t capacity = 16, uint32_t queue = 8) {
  Admission::Options options;
  options.budget_bytes = bytes;
  options.capacity = capacity;
  options.max_queued = queue;
  return options;
}

TEST(AdmissionTest, BytesAreReservedAndTooLargeARequestIsRefusedAtOnce) {
  auto admission = Admission::Create(Budget(1000));
  auto a = admission->Admit(600);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(admission->reserved_bytes(), 600);
  EXPECT_EQ(admission->free_bytes(), 400);
  EXPECT_EQ((*a)->bytes(), 600);
  // A wait for room would last until this deadline; a request that can never fit must not wait.
  const absl::Time before = absl::Now();
  auto huge = admission->Admit(1001, before + absl::Seconds(10));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("needs 1001 bytes"));
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("budget of 1000 bytes"));
  // At once: no wait for room (a bound in wall-clock milliseconds failed once in CI under load).
  EXPECT_LT(absl::Now() - before, absl::Seconds(5));
  a->reset();
  EXPECT_EQ(admission->reserved_bytes(), 0);
}

TEST(AdmissionTest, WaitersAreAdmittedFirstComeFirstAsBytesFree) {
  auto admission = Admission::Create(Budget(1000));
  auto held = admission->Admit(900);
  ASSERT_TRUE(held.ok());
  std::vector<std::unique_ptr<Admission::Reservation>> admitted(3);
  std::vector<std::thread> waiters;
  // 500 first, then two of 50: the small ones would fit beside the held 900 but wait behind the
  // 500 at the head.
  const int64_t sizes[] = {500, 50, 50};
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] {
      auto r = admission->Admit(sizes[i]);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_GT((*r)->waited(), absl::ZeroDuration());
      admitted[i] = *std::move(r);
    });
    while (admission->queued() < static_cast<uint32_t>(i + 1)) absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(admission->queued(), 3u);  // nobody overtook the 500
  EXPECT_EQ(admission->reserved_bytes(), 900);
  EXPECT_EQ(admission->queued_bytes(), 600);
  held->reset();  // 1000 free: all three fit
  for (auto& w : waiters) w.join();
  EXPECT_EQ(admission->reserved_bytes(), 600);
  EXPECT_EQ(admission->active(), 3u);
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(admission->queued_bytes(), 0);
}

TEST(AdmissionTest, AFullQueueRefusesAtOnceNamingIt) {
  auto admission = Admission::Create(Budget(100, 16, /*queue=*/2));
  auto held = admission->Admit(100);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] { EXPECT_TRUE(admission->Admit(10).ok()); });
  }
  while (admission->queued() < 2) absl::SleepFor(absl::Milliseconds(1));
  auto refused = admission->Admit(10);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("queue holds 2 of 2"));
  held->reset();
  for (auto& w : waiters) w.join();
}

TEST(AdmissionTest, CapacityBoundsRequestsEvenWhenBytesFit) {
  auto admission = Admission::Create(Budget(1 << 20, /*capacity=*/2));
  auto a = admission->Admit(1), b = admission->Admit(1);
  std::thread third([&] { EXPECT_TRUE(admission->Admit(1).ok()); });
  while (admission->queued() < 1) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(admission->active(), 2u);
  a->reset();
  third.join();
}

TEST(AdmissionTest, AWaiterLeavesAtItsDeadlineOrCancelAndTheNextGoesOn) {
  auto admission = Admission::Create(Budget(100));
  auto held = admission->Admit(100);
  Cancellation cancel;
  absl::Status expired, cancelled;
  std::thread a([&] {
    expired = admission->Admit(10, absl::Now() + absl::Milliseconds(60)).status();
  });
  std::thread b([&] { cancelled = admission->Admit(10, absl::InfiniteFuture(), &cancel).status(); });
  while (admission->queued() < 2) absl::SleepFor(absl::Milliseconds(1));
  cancel.Cancel(absl::CancelledError("the caller went away"));
  a.join();
  b.join();
  EXPECT_EQ(expired.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(expired.message()), HasSubstr("waiting for KV memory"));
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(admission->queued(), 0u);
  EXPECT_EQ(admission->queued_bytes(), 0);
  held->reset();
  EXPECT_TRUE(admission->Admit(100).ok());  // nothing left behind
}

TEST(AdmissionTest, DrainingRefusesWaitingRequests) {
  auto admission = Admission::Create(Budget(100));
  auto held = admission->Admit(100);
  absl::Status waited;
  std::thread w([&] { waited = admission->Admit(10).status(); });
  while (admission->queued() < 1) absl::SleepFor(absl::Milliseconds(1));
  admission->Drain();
  w.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admission->active(), 1u);
}

}  // namespace
}  // namespace scd::consumer
