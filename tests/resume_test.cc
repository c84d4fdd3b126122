// Resume through another coordinator (coordinator/resume_token.h, GenerateRequest.resume_token) on
// tests/two_coordinators.h's deployment: a client's stream through coordinator A, A shut down
// after a few tokens, the same request sent again through B with the Started's resume token and
// the ids received: B's stream opens with a Moved (resumed) event, goes on with exactly the tokens
// an unfaulted stream gives after them (greedy and seeded sampling), and ends in one Finished that
// counts every token once. A replay at the same position, another tenant's request and a forged
// token are refused alike, before any work.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/resume_token.h"
#include "tests/two_coordinators.h"

namespace scd {
namespace {

using ResumeTest = TwoCoordinatorsTest;

struct Streamed {
  absl::Status status;
  std::vector<v1::GenerateEvent> events;
  std::vector<int32_t> ids;
  std::string token;
  bool finished = false;
  uint32_t output_tokens = 0;
};

// Streams `request` through `via`; `each` (may be null) sees every event after it was recorded.
Streamed Stream(const coordinator::CoordinatorNode& via, const v1::GenerateRequest& request,
                const std::function<void(const Streamed&)>& each = nullptr) {
  Streamed s;
  s.status =
      StreamGenerate(via.address(), request, absl::Seconds(60), [&](const v1::GenerateEvent& e) {
        s.events.push_back(e);
        if (e.has_started()) s.token = e.started().resume_token();
        if (e.has_token()) {
          s.ids.insert(s.ids.end(), e.token().ids().begin(), e.token().ids().end());
        }
        if (e.has_finished()) {
          s.finished = true;
          s.output_tokens = e.finished().output_tokens();
        }
        if (each) each(s);
      });
  return s;
}

// The request's stream through A until A goes away after `tokens` tokens, then resumed through B:
// its ids equal the unfaulted stream's.
void ResumeAfter(TwoCoordinatorsTest* t, coordinator::CoordinatorNode* a,
                 const coordinator::CoordinatorNode& b, const v1::GenerateRequest& request,
                 size_t tokens) {
  const Streamed reference = Stream(b, request);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_TRUE(reference.finished);
  ASSERT_GT(reference.ids.size(), tokens + 8) << "long enough to be cut";
  bool gone = false;
  const Streamed cut = Stream(*a, request, [&](const Streamed& s) {
    if (!gone && s.ids.size() >= tokens) {
      gone = true;
      a->Shutdown(absl::ZeroDuration());  // the client's coordinator goes away mid-stream
    }
  });
  ASSERT_TRUE(gone);
  ASSERT_FALSE(cut.finished) << "the stream ended before A went away";
  EXPECT_FALSE(cut.status.ok());
  ASSERT_FALSE(cut.token.empty()) << "A's Started carried a resume token";
  ASSERT_LT(cut.ids.size(), reference.ids.size());

  v1::GenerateRequest again = request;
  again.set_resume_token(cut.token);
  for (int32_t id : cut.ids) again.add_resume_received_ids(id);
  const Streamed resumed = Stream(b, again);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_FALSE(resumed.events.empty());
  ASSERT_TRUE(resumed.events.front().has_moved()) << resumed.events.front().DebugString();
  const v1::Moved& moved = resumed.events.front().moved();
  EXPECT_TRUE(moved.resumed());
  EXPECT_EQ(moved.tokens_so_far(), cut.ids.size());
  EXPECT_EQ(moved.moves(), 0u);
  for (const v1::GenerateEvent& e : resumed.events) EXPECT_FALSE(e.has_started()) << "one Started";
  EXPECT_TRUE(resumed.finished);
  std::vector<int32_t> whole = cut.ids;
  whole.insert(whole.end(), resumed.ids.begin(), resumed.ids.end());
  EXPECT_EQ(whole, reference.ids) << "no token missing, repeated or different";
  EXPECT_EQ(resumed.output_tokens, reference.output_tokens) << "every token counted once";

  // The same token at the same position again: refused as any bad token, before any work.
  const Streamed replay = Stream(b, again);
  EXPECT_EQ(replay.status.code(), absl::StatusCode::kPermissionDenied) << replay.status;
  EXPECT_EQ(replay.status.message(), coordinator::kResumeRefused);
  EXPECT_TRUE(replay.events.empty());
  (void)t;
}

TEST_F(ResumeTest, AGreedyStreamGoesOnThroughAnotherCoordinator) {
  ResumeAfter(this, a_.get(), *b_, Request(96), 5);
}

TEST_F(ResumeTest, ASeededSampledStreamGoesOnWithTheSameTokens) {
  v1::GenerateRequest request = Request(96);
  request.set_temperature(0.8f);
  request.set_top_p(0.9f);
  request.set_seed(1234);
  ResumeAfter(this, a_.get(), *b_, request, 7);
}

// The client library's resume (StreamGenerateResuming, what `scd generate --server A,B` runs): one
// stream for the caller, its coordinator gone halfway.
TEST_F(ResumeTest, TheClientLibraryResumesThroughTheNextCoordinator) {
  const v1::GenerateRequest request = Request(96);
  const Streamed reference = Stream(*b_, request);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  std::vector<int32_t> ids;
  int started = 0, moved = 0, finished = 0, resumes = 0;
  bool gone = false;
  const absl::Status status = StreamGenerateResuming(
      {a_->address(), b_->address()}, request, absl::Seconds(60),
      [&](const v1::GenerateEvent& e) {
        started += e.has_started() ? 1 : 0;
        moved += e.has_moved() && e.moved().resumed() ? 1 : 0;
        finished += e.has_finished() ? 1 : 0;
        if (e.has_token()) ids.insert(ids.end(), e.token().ids().begin(), e.token().ids().end());
        if (!gone && ids.size() >= 6) {
          gone = true;
          a_->Shutdown(absl::ZeroDuration());
        }
      },
      &resumes);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(resumes, 1);
  EXPECT_EQ(started, 1);
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(ids, reference.ids);
}

TEST_F(ResumeTest, AnotherTenantsOrAForgedTokenIsRefusedAlike) {
  const Streamed first = Stream(*a_, Request(8));
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_FALSE(first.token.empty());
  auto refused = [&](v1::GenerateRequest request, const std::string& what) {
    const Streamed s = Stream(*b_, request);
    EXPECT_EQ(s.status.code(), absl::StatusCode::kPermissionDenied) << what << ": " << s.status;
    EXPECT_EQ(s.status.message(), coordinator::kResumeRefused) << what;
    EXPECT_TRUE(s.events.empty()) << what;
  };
  v1::GenerateRequest other_tenant = Request(8);
  other_tenant.set_cache_salt("another tenant");
  other_tenant.set_resume_token(first.token);
  refused(other_tenant, "another tenant");
  v1::GenerateRequest forged = Request(8);
  std::string token = first.token;
  token.back() ^= 1;
  forged.set_resume_token(token);
  refused(forged, "a forged token");
  v1::GenerateRequest longer = Request(9);
  longer.set_resume_token(first.token);
  refused(longer, "another request (max_tokens)");
}

}  // namespace
}  // namespace scd
