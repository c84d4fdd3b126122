// NameThisThread: the name reaches the kernel (/proc/self/task/TID/comm), only for the calling
// thread, cut to 15 characters.
#include "base/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

namespace scd {
namespace {

std::string Comm(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

TEST(ThreadNameTest, NamesOnlyTheCallingThreadCutTo15Characters) {
  const std::string main_name = ThisThreadName();
  long tid = 0;
  std::string seen;
  std::thread([&] {
    NameThisThread("scd-a-rather-long-name");
    tid = syscall(SYS_gettid);
    seen = Comm(tid);
    EXPECT_EQ(ThisThreadName(), "scd-a-rather-lo");
  }).join();
  EXPECT_EQ(seen, "scd-a-rather-lo");
  EXPECT_EQ(ThisThreadName(), main_name);
}

}  // namespace
}  // namespace scd
