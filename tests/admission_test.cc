// consumer::Admission: capacity is reserved before work starts, refused early when full, released
// by whatever ends the request, and closed to new work while draining.
#include "consumer/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

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

}  // namespace
}  // namespace scd::consumer
