// ResumeBook (coordinator/resume_book.h) on given times: a token works once per position (a
// replay reads as any bad token), another position of the same token is a new resume, a tenant
// has at most its rate per minute, and what is remembered goes when the token expires.
#include "coordinator/resume_book.h"

#include <gtest/gtest.h>

#include "coordinator/resume_token.h"

namespace scd::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'900'000'000);

TEST(ResumeBookTest, OncePerPositionAndTenantRate) {
  ResumeBook book(ResumeBook::Options{/*per_tenant_per_minute=*/3});
  const absl::Time expires = kT0 + absl::Minutes(10);
  EXPECT_TRUE(book.Admit("mac-1", 5, "a", expires, kT0).ok());
  const absl::Status replay = book.Admit("mac-1", 5, "a", expires, kT0 + absl::Seconds(1));
  EXPECT_EQ(replay.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(replay.message(), kResumeRefused);
  EXPECT_TRUE(book.Admit("mac-1", 9, "a", expires, kT0 + absl::Seconds(2)).ok())
      << "the same stream, further on";
  EXPECT_TRUE(book.Admit("mac-2", 0, "a", expires, kT0 + absl::Seconds(3)).ok());
  const absl::Status fourth = book.Admit("mac-3", 0, "a", expires, kT0 + absl::Seconds(4));
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted) << fourth;
  EXPECT_TRUE(book.Admit("mac-3", 0, "b", expires, kT0 + absl::Seconds(4)).ok())
      << "another tenant has its own rate";
  EXPECT_TRUE(book.Admit("mac-4", 0, "a", expires, kT0 + absl::Seconds(61)).ok())
      << "a minute after the first, the tenant has room again";
}

TEST(ResumeBookTest, ATokenIsForgottenOnceItExpired) {
  ResumeBook book(ResumeBook::Options{/*per_tenant_per_minute=*/100});
  EXPECT_TRUE(book.Admit("mac-1", 5, "a", kT0 + absl::Seconds(10), kT0).ok());
  EXPECT_FALSE(book.Admit("mac-1", 5, "a", kT0 + absl::Seconds(10), kT0 + absl::Seconds(9)).ok());
  // Past its expiry the token itself is refused (CheckResumeToken); the book holds nothing more.
  EXPECT_TRUE(book.Admit("mac-1", 5, "a", kT0 + absl::Seconds(10), kT0 + absl::Seconds(11)).ok());
}

}  // namespace
}  // namespace scd::coordinator
