// Resume tokens (coordinator/resume_token.h): a token checks out for the request it was made for,
// as the client sends it again (its request id empty, its relative deadline as before), and grants
// the stream's id, target, absolute deadline and mode (a fan-out's tokens each their own target);
// any other request, tenant, API token or secret, a token past its expiry, a forged or truncated
// one, a claim of another target: PERMISSION_DENIED with the same message.
#include "coordinator/resume_token.h"

#include <gtest/gtest.h>

namespace scd::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'900'000'000);

ClusterSecret Secret(const std::string& value = "resume-token-test-secret-01") {
  return *ClusterSecret::Of(value);
}

v1::GenerateRequest Original() {
  v1::GenerateRequest request;
  request.add_prompt_ids(1);
  request.add_prompt_ids(403);
  request.add_prompt_ids(9);
  request.add_targets("fables");
  request.add_targets("tales");
  request.set_max_tokens(32);
  request.set_temperature(0.8f);
  request.set_top_p(0.9f);
  request.set_seed(7);
  request.set_deadline_ms(30000);
  request.set_cache_salt("tenant-a");
  return request;
}

// The request as its client sends it again, with the token and what it received.
v1::GenerateRequest Again(const std::string& token) {
  v1::GenerateRequest request = Original();
  request.set_resume_token(token);
  request.add_resume_received_ids(5);
  request.add_resume_received_ids(6);
  return request;
}

std::string Token(const ClusterSecret& secret = Secret(), const std::string& api = "Bearer k1",
                  const std::string& target = "fables") {
  v1::GenerateRequest served = Original();
  served.set_request_id("req-1");  // the coordinator made it
  return IssueResumeToken(secret, served, api, kT0 + absl::Seconds(30), TransferMode::kScd, target);
}

void ExpectRefused(const absl::StatusOr<ResumeGrant>& grant, const std::string& what) {
  EXPECT_EQ(grant.status().code(), absl::StatusCode::kPermissionDenied) << what;
  EXPECT_EQ(grant.status().message(), kResumeRefused) << what << ": the same answer for all";
}

TEST(ResumeTokenTest, GrantsTheStreamItWasMadeFor) {
  absl::StatusOr<ResumeGrant> grant =
      CheckResumeToken(Secret(), Again(Token()), "Bearer k1", kT0 + absl::Seconds(1));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->request_id, "req-1");
  EXPECT_EQ(grant->target, "fables");
  EXPECT_EQ(grant->deadline, kT0 + absl::Seconds(30)) << "carried, not reset";
  EXPECT_EQ(grant->mode, TransferMode::kScd);
  EXPECT_FALSE(grant->mac.empty());
  // The fan-out's other target: a token of its own, another MAC.
  absl::StatusOr<ResumeGrant> other = CheckResumeToken(
      Secret(), Again(Token(Secret(), "Bearer k1", "tales")), "Bearer k1", kT0 + absl::Seconds(1));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->target, "tales");
  EXPECT_NE(other->mac, grant->mac);
}

TEST(ResumeTokenTest, RefusesAnyOtherRequestTenantKeyOrSecretTheSameWay) {
  const absl::Time now = kT0 + absl::Seconds(1);
  const std::string token = Token();
  {
    v1::GenerateRequest other = Again(token);
    other.set_prompt_ids(1, 404);
    ExpectRefused(CheckResumeToken(Secret(), other, "Bearer k1", now), "another prompt");
  }
  {
    v1::GenerateRequest other = Again(token);
    other.set_seed(8);
    ExpectRefused(CheckResumeToken(Secret(), other, "Bearer k1", now), "another seed");
  }
  {
    v1::GenerateRequest other = Again(token);
    other.set_cache_salt("tenant-b");
    ExpectRefused(CheckResumeToken(Secret(), other, "Bearer k1", now), "another tenant");
  }
  ExpectRefused(CheckResumeToken(Secret(), Again(token), "Bearer k2", now), "another API token");
  ExpectRefused(CheckResumeToken(Secret(), Again(token), "", now), "no API token");
  ExpectRefused(
      CheckResumeToken(Secret("another-cluster-secret-99"), Again(token), "Bearer k1", now),
      "another deployment's secret");
  ExpectRefused(CheckResumeToken(Secret(), Again(token), "Bearer k1", kT0 + absl::Seconds(30)),
                "expired");
  ExpectRefused(
      CheckResumeToken(Secret(), Again(token.substr(0, token.size() / 2)), "Bearer k1", now),
      "truncated");
  ExpectRefused(CheckResumeToken(Secret(), Again("not a token"), "Bearer k1", now), "garbage");
  // A forged claim: the deadline moved later, the MAC kept.
  v1::ResumeToken forged;
  ASSERT_TRUE(forged.ParseFromString(token));
  forged.set_expires_unix_ms(forged.expires_unix_ms() + 3'600'000);
  ExpectRefused(CheckResumeToken(Secret(), Again(forged.SerializeAsString()), "Bearer k1",
                                 kT0 + absl::Seconds(40)),
                "forged expiry");
  forged.ParseFromString(token);
  forged.set_request_id("req-2");
  ExpectRefused(CheckResumeToken(Secret(), Again(forged.SerializeAsString()), "Bearer k1", now),
                "another request id");
  forged.ParseFromString(token);
  forged.set_target("tales");
  ExpectRefused(CheckResumeToken(Secret(), Again(forged.SerializeAsString()), "Bearer k1", now),
                "the fan-out's other target claimed");
  // A genuine token for a target the request does not list (a coordinator never makes one).
  {
    v1::GenerateRequest served = Original();
    served.set_request_id("req-1");
    const std::string stray = IssueResumeToken(Secret(), served, "Bearer k1",
                                               kT0 + absl::Seconds(30), TransferMode::kScd, "xs");
    ExpectRefused(CheckResumeToken(Secret(), Again(stray), "Bearer k1", now), "no such target");
  }
}

}  // namespace
}  // namespace scd::coordinator
