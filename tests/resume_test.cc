// Resume through another coordinator (coordinator/resume_token.h, GenerateRequest.resume_token) on
// tests/two_coordinators.h's deployment: a client's stream through coordinator A ends after a few
// tokens and A is shut down, the same request sent again through B with the Started's resume token
// and the ids received: B's stream opens with a Moved (resumed) event, goes on with exactly the
// tokens an unfaulted stream gives after them (greedy and seeded sampling), and ends in one
// Finished that counts every token once; a fan-out's targets each resume alone with their own
// token; a stream cut after its last token is finished by B itself; received ids the model would
// not have picked end the resumed stream in an Error. A replay at the same position, another
// tenant's request and a forged token are refused alike, before any work.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_tls.h"
#include "coordinator/resume_token.h"
#include "proto/grpc_util.h"
#include "scd/v1/inference.grpc.pb.h"
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

// The client's side of "its coordinator went away", without a race: the client reads through A
// until `enough` says so and its call ends there (cancelled; nothing after it is read), whether or
// not A would have finished the stream; then A is shut down. What the client has is what it
// resumes from.
Streamed CutWhen(coordinator::CoordinatorNode* a, const v1::GenerateRequest& request,
                 const std::function<bool(const Streamed&)>& enough) {
  Streamed s;
  auto stub = v1::Inference::NewStub(NewGrpcChannel(a->address()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->Generate(&context, request);
  v1::GenerateEvent e;
  while (!enough(s) && reader->Read(&e)) {
    s.events.push_back(e);
    if (e.has_started()) s.token = e.started().resume_token();
    if (e.has_token()) s.ids.insert(s.ids.end(), e.token().ids().begin(), e.token().ids().end());
    if (e.has_finished()) s.finished = true;
  }
  context.TryCancel();
  s.status = FromGrpcStatus(reader->Finish());
  a->Shutdown(absl::ZeroDuration());
  return s;
}

// CutWhen after `tokens` tokens.
Streamed CutAfter(coordinator::CoordinatorNode* a, const v1::GenerateRequest& request,
                  size_t tokens) {
  return CutWhen(a, request, [tokens](const Streamed& s) { return s.ids.size() >= tokens; });
}

// The request's stream through A, cut after `tokens` tokens, then resumed through B: its ids
// equal the unfaulted stream's.
void ResumeAfter(coordinator::CoordinatorNode* a, const coordinator::CoordinatorNode& b,
                 const v1::GenerateRequest& request, size_t tokens) {
  const Streamed reference = Stream(b, request);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_TRUE(reference.finished);
  ASSERT_GT(reference.ids.size(), tokens + 8) << "long enough to be cut";
  const Streamed cut = CutAfter(a, request, tokens);
  ASSERT_FALSE(cut.finished);
  EXPECT_EQ(cut.status.code(), absl::StatusCode::kCancelled) << cut.status;
  ASSERT_FALSE(cut.token.empty()) << "A's Started carried a resume token";
  ASSERT_GE(cut.ids.size(), tokens);
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
  // A greedy stream's received ids were checked by the new replica's prefill: local throughout
  // here, so exactly (consumer/continuation_check.h); a sampled one's are not.
  ASSERT_TRUE(resumed.events.back().has_finished());
  const v1::Finished& f = resumed.events.back().finished();
  if (request.temperature() == 0) {
    ASSERT_TRUE(f.has_continuation());
    EXPECT_EQ(f.continuation().checked(), cut.ids.size());
    EXPECT_EQ(f.continuation().parted(), 0u) << "worst gap " << f.continuation().worst_gap();
    EXPECT_TRUE(f.continuation().exact());
  } else {
    EXPECT_FALSE(f.has_continuation());
  }

  // The same token at the same position again: refused as any bad token, before any work.
  const Streamed replay = Stream(b, again);
  EXPECT_EQ(replay.status.code(), absl::StatusCode::kPermissionDenied) << replay.status;
  EXPECT_EQ(replay.status.message(), coordinator::kResumeRefused);
  EXPECT_TRUE(replay.events.empty());
}

TEST_F(ResumeTest, AGreedyStreamGoesOnThroughAnotherCoordinator) {
  ResumeAfter(a_.get(), *b_, Request(96), 5);
}

TEST_F(ResumeTest, ASeededSampledStreamGoesOnWithTheSameTokens) {
  v1::GenerateRequest request = Request(96);
  request.set_temperature(0.8f);
  request.set_top_p(0.9f);
  request.set_seed(1234);
  ResumeAfter(a_.get(), *b_, request, 7);
}

// The client library's resume (StreamGenerateResuming, what `scd generate --server A,B` runs): one
// stream for the caller, whose call through A breaks after 6 tokens (UNAVAILABLE, as when A's
// process dies: the call ends after what the client read, CutAfter) and goes on through B.
TEST_F(ResumeTest, TheClientLibraryResumesThroughTheNextCoordinator) {
  const v1::GenerateRequest request = Request(96);
  const Streamed reference = Stream(*b_, request);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  const std::string a = a_->address();
  GenerateCall call = [&](const std::string& server, const v1::GenerateRequest& r,
                          absl::Duration timeout,
                          const std::function<void(const v1::GenerateEvent&)>& on_event) {
    if (server != a) return StreamGenerate(server, r, timeout, on_event);
    const Streamed cut = CutAfter(a_.get(), r, 6);
    for (const v1::GenerateEvent& e : cut.events) on_event(e);
    return absl::UnavailableError("the coordinator went away");
  };
  std::vector<int32_t> ids;
  int started = 0, moved = 0, finished = 0, resumes = 0;
  const absl::Status status = StreamGenerateResuming(
      {a, b_->address()}, request, absl::Seconds(60),
      [&](const v1::GenerateEvent& e) {
        started += e.has_started() ? 1 : 0;
        moved += e.has_moved() && e.moved().resumed() ? 1 : 0;
        finished += e.has_finished() ? 1 : 0;
        if (e.has_token()) ids.insert(ids.end(), e.token().ids().begin(), e.token().ids().end());
      },
      &resumes, call);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(resumes, 1);
  EXPECT_EQ(started, 1);
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(ids, reference.ids);
}

// A fan-out's targets each resume alone with their own token (inference.proto resume_token):
// a second consumer node ("twin", another model) beside "tales", the fan-out's call through A cut
// once both targets streamed 3 tokens, then the client library resumes each target through B at
// once. Each target's stream is the unfaulted one's: one Started, one Moved (resumed), the same
// ids, one Finished.
TEST_F(ResumeTest, AFanOutsTargetsEachResumeAloneWithTheirOwnTokens) {
  consumer::ConsumerNodeOptions options;
  options.model.model_dir = testing::ModelDir("stories260k-fables");
  options.model.name = "twin";
  options.cluster_secret = kTwoCoordinatorsSecret;
  options.coordinator = etcd_->registry();
  absl::StatusOr<std::unique_ptr<consumer::ConsumerNode>> twin =
      consumer::ConsumerNode::Start(options);
  ASSERT_TRUE(twin.ok()) << twin.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  ASSERT_TRUE(a_->registry().AwaitSize(2, deadline));
  ASSERT_TRUE(b_->registry().AwaitSize(2, deadline));
  v1::GenerateRequest request = Request(96);
  request.add_targets("twin");
  std::map<std::string, std::vector<int32_t>> reference;
  ASSERT_TRUE(
      StreamGenerate(b_->address(), request, absl::Seconds(60), [&](const v1::GenerateEvent& e) {
        if (!e.has_token()) return;
        std::vector<int32_t>& ids = reference[e.target()];
        ids.insert(ids.end(), e.token().ids().begin(), e.token().ids().end());
      }).ok());
  ASSERT_EQ(reference.size(), 2u);
  ASSERT_NE(reference["tales"], reference["twin"]) << "two models: two streams";

  const std::string a = a_->address();
  GenerateCall call = [&](const std::string& server, const v1::GenerateRequest& r,
                          absl::Duration timeout,
                          const std::function<void(const v1::GenerateEvent&)>& on_event) {
    if (server != a) return StreamGenerate(server, r, timeout, on_event);
    // CutWhen asks once before the first read and once after each event: each event counted once.
    std::map<std::string, size_t> tokens;
    const Streamed cut = CutWhen(a_.get(), r, [&](const Streamed& s) {
      if (!s.events.empty() && s.events.back().has_token()) {
        tokens[s.events.back().target()] += s.events.back().token().ids_size();
      }
      return tokens["tales"] >= 3 && tokens["twin"] >= 3;
    });
    for (const v1::GenerateEvent& e : cut.events) on_event(e);
    return absl::UnavailableError("the coordinator went away");
  };
  std::map<std::string, std::vector<int32_t>> ids;
  std::map<std::string, int> started, moved, finished;
  std::set<std::string> tokens;
  int resumes = 0;
  const absl::Status status = StreamGenerateResuming(
      {a, b_->address()}, request, absl::Seconds(60),
      [&](const v1::GenerateEvent& e) {
        started[e.target()] += e.has_started() ? 1 : 0;
        if (e.has_started()) tokens.insert(e.started().resume_token());
        moved[e.target()] += e.has_moved() && e.moved().resumed() ? 1 : 0;
        finished[e.target()] += e.has_finished() ? 1 : 0;
        if (e.has_token()) {
          ids[e.target()].insert(ids[e.target()].end(), e.token().ids().begin(),
                                 e.token().ids().end());
        }
      },
      &resumes, call);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(resumes, 2);
  EXPECT_EQ(tokens.size(), 2u) << "a token per target";
  for (const std::string target : {"tales", "twin"}) {
    SCOPED_TRACE(target);
    EXPECT_EQ(started[target], 1);
    EXPECT_EQ(moved[target], 1);
    EXPECT_EQ(finished[target], 1);
    EXPECT_EQ(ids[target], reference[target]);
  }
}

// The client had every token (max_tokens) but not the Finished when its coordinator went away:
// nothing is left to generate, so B ends the resumed stream itself (a Moved, a Finished counting
// the tokens once) instead of sending a consumer a continuation it refuses. The soak met it: the
// resume ended INVALID_ARGUMENT ("continued_ids: 9 tokens streamed already, max_tokens 9 leaves
// none to generate").
TEST_F(ResumeTest, AStreamCutAfterItsLastTokenIsFinishedByTheNextCoordinator) {
  const v1::GenerateRequest request = Request(8);
  const Streamed reference = Stream(*b_, request);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(reference.ids.size(), 8u) << "the story must not end within max_tokens";
  const Streamed cut =
      CutWhen(a_.get(), request, [](const Streamed& s) { return s.ids.size() >= 8; });
  ASSERT_FALSE(cut.finished);
  ASSERT_FALSE(cut.token.empty());
  ASSERT_EQ(cut.ids, reference.ids);

  v1::GenerateRequest again = request;
  again.set_resume_token(cut.token);
  for (int32_t id : cut.ids) again.add_resume_received_ids(id);
  const Streamed resumed = Stream(*b_, again);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.events.size(), 2u);
  ASSERT_TRUE(resumed.events[0].has_moved()) << resumed.events[0].DebugString();
  EXPECT_TRUE(resumed.events[0].moved().resumed());
  EXPECT_EQ(resumed.events[0].moved().tokens_so_far(), 8u);
  ASSERT_TRUE(resumed.events[1].has_finished()) << resumed.events[1].DebugString();
  const v1::Finished& f = resumed.events[1].finished();
  EXPECT_EQ(f.reason(), "length");
  EXPECT_EQ(f.output_tokens(), 8u) << "every token counted once";
  EXPECT_EQ(f.output_tokens(), reference.output_tokens);
  EXPECT_EQ(f.prompt_tokens(), static_cast<uint32_t>(request.prompt_ids_size()));

  // More received ids than max_tokens allows: refused before any work, nothing counted.
  v1::GenerateRequest more = again;
  more.add_resume_received_ids(cut.ids.back());
  const Streamed refused = Stream(*b_, more);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_TRUE(refused.events.empty());
}

// A valid token with received ids the stream never had: the new replica's prefill finds an id
// it would not pick greedily (the stream was decoded on local prefills only, so nothing but a
// near-tie could part) and the stream ends in one Error that names it, with no token emitted.
TEST_F(ResumeTest, ReceivedIdsTheModelWouldNotPickEndTheResumeInAnError) {
  const v1::GenerateRequest request = Request(24);
  const Streamed cut = CutAfter(a_.get(), request, 6);
  ASSERT_FALSE(cut.token.empty());
  ASSERT_GE(cut.ids.size(), 6u);
  v1::GenerateRequest again = request;
  again.set_resume_token(cut.token);
  std::vector<int32_t> forged = cut.ids;
  forged[2] = forged[2] == 13 ? 14 : 13;  // a common id of its vocabulary, but not its pick
  for (int32_t id : forged) again.add_resume_received_ids(id);
  const Streamed resumed = Stream(*b_, again);
  ASSERT_FALSE(resumed.events.empty()) << resumed.status;
  EXPECT_TRUE(resumed.events.front().has_moved()) << resumed.events.front().DebugString();
  EXPECT_TRUE(resumed.ids.empty()) << "no token after a refused continuation";
  const v1::GenerateEvent& last = resumed.events.back();
  ASSERT_TRUE(last.has_error()) << last.DebugString();
  EXPECT_EQ(last.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(last.error().message().find("continued_ids[2]"), std::string::npos)
      << last.error().message();
  EXPECT_FALSE(resumed.finished);
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
