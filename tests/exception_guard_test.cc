// base/exception_guard.h: what a body throws becomes a status; values pass through untouched.
#include "base/exception_guard.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace scd {
namespace {

TEST(ExceptionGuardTest, ValuesAndStatusesPassThrough) {
  absl::StatusOr<int> v = GuardExceptions("f", []() -> absl::StatusOr<int> { return 7; });
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  absl::Status s =
      GuardExceptions("f", []() -> absl::Status { return absl::NotFoundError("gone"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "gone");
}

TEST(ExceptionGuardTest, ExceptionsBecomeStatuses) {
  absl::StatusOr<int> e = GuardExceptions("LlamaModel::Forward", []() -> absl::StatusOr<int> {
    throw std::runtime_error(
        "shape mismatch\nException raised from foo at bar.cpp:1 (most recent call first):\n#0");
  });
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(e.status().message(), "LlamaModel::Forward: shape mismatch");  // no backtrace
  absl::Status oom = GuardExceptions("g", []() -> absl::Status { throw std::bad_alloc(); });
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  absl::Status odd = GuardExceptions("h", []() -> absl::Status { throw 42; });
  EXPECT_EQ(odd.code(), absl::StatusCode::kInternal);
  EXPECT_NE(odd.message().find("h: unknown"), std::string::npos);
}

}  // namespace
}  // namespace scd
