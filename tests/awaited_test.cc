// base/awaited.h: the value arrives whether it is delivered before Wait, after it, or from
// another thread; and the waiter may return and free its side while the delivering thread is
// still inside the setter (thousands of rounds: the race that a notification on the waiter's
// stack lost in Admission::Admit).
#include "base/awaited.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace scd {
namespace {

TEST(Awaited, DeliveredBeforeOrAfterTheWait) {
  Awaited<std::string> early;
  early.Setter()("early");
  EXPECT_EQ(early.Wait(), "early");

  Awaited<int> late;
  std::thread deliver([setter = late.Setter()] { setter(42); });
  EXPECT_EQ(late.Wait(), 42);
  deliver.join();
}

TEST(Awaited, TheWaiterMayLeaveWhileTheSetterReturns) {
  std::vector<std::thread> deliverers;
  for (int i = 0; i < 2000; ++i) {
    auto setter = [&deliverers] {
      Awaited<int> value;
      std::function<void(int)> set = value.Setter();
      deliverers.emplace_back([set = std::move(set)] { set(7); });
      return value.Wait();  // `value` is gone right after, the setter may still be returning
    };
    ASSERT_EQ(setter(), 7);
  }
  for (std::thread& t : deliverers) t.join();
}

}  // namespace
}  // namespace scd
