// The soak's judgement of each stream against the fault schedule (bench/soak_check.h): windows,
// which faults are on a request's path, the outcome classes, deadline overruns and the tallies --
// on hand-made records and faults with known answers.
#include "bench/soak_check.h"

#include <gtest/gtest.h>

namespace scd::bench {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
absl::Time At(double s) { return kT0 + absl::Seconds(s); }

FaultOutcome Fault(FaultKind kind, SoakRole role, const std::string& model,
                   const std::string& address, double start, double recovered) {
  FaultOutcome f;
  f.fault.kind = kind;
  f.node = kind == FaultKind::kFlap ? "" : "node";
  f.role = role;
  f.model = model;
  f.address = address;
  f.start = At(start);
  f.acted = At(start + 1);
  f.recovered = recovered < 0 ? absl::InfinitePast() : At(recovered);
  return f;
}

SoakRecord Record(const std::string& mode, const std::string& target, double sent, double ended,
                  int code, const std::string& coordinator = "c0:1") {
  SoakRecord r;
  r.spec.mode = mode;
  r.spec.targets = {target};
  r.spec.deadline_ms = 20000;
  r.coordinator = coordinator;
  r.sent = At(sent);
  r.ended = At(ended);
  SoakStream& s = r.streams.emplace_back();
  s.target = target;
  s.code = code;
  s.finished = code == 0;
  s.terminals = 1;
  return r;
}

constexpr int kUnavailable = static_cast<int>(absl::StatusCode::kUnavailable);

TEST(SoakCheckTest, AWindowRunsFromTheFaultToItsRecoveryPlusTheGrace) {
  const std::vector<FaultWindow> w =
      FaultWindows({Fault(FaultKind::kKill, SoakRole::kConsumer, "fables", "a:1", 10, 20),
                    Fault(FaultKind::kFreeze, SoakRole::kProducer, "", "", 30, -1)},
                   At(100), absl::Seconds(2));
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].from, At(10));
  EXPECT_EQ(w[0].to, At(22));
  EXPECT_EQ(w[1].to, At(102));  // never recovered: to the run's end
}

TEST(SoakCheckTest, AFaultIsOnThePathOfWhatItCanBreak) {
  const SoakRecord local = Record("local", "fables", 0, 1, kUnavailable, "c0:1");
  const SoakRecord scd = Record("scd", "xs", 0, 1, kUnavailable, "c1:1");
  const FaultOutcome fables = Fault(FaultKind::kKill, SoakRole::kConsumer, "fables", "f:1", 0, 1);
  EXPECT_TRUE(OnPath(fables, local, local.streams[0]));
  EXPECT_FALSE(OnPath(fables, scd, scd.streams[0]));  // another model
  const FaultOutcome producer = Fault(FaultKind::kFreeze, SoakRole::kProducer, "", "", 0, 1);
  EXPECT_FALSE(OnPath(producer, local, local.streams[0]));  // local prefill needs no producer
  EXPECT_TRUE(OnPath(producer, scd, scd.streams[0]));
  const FaultOutcome flap = Fault(FaultKind::kFlap, SoakRole::kEtcd, "", "", 0, 1);
  EXPECT_FALSE(OnPath(flap, local, local.streams[0]));
  EXPECT_TRUE(OnPath(flap, scd, scd.streams[0]));
  const FaultOutcome cut = Fault(FaultKind::kLinkDown, SoakRole::kProducer, "", "p:1", 0, 1);
  EXPECT_FALSE(OnPath(cut, local, local.streams[0]));  // the producer's link only
  EXPECT_TRUE(OnPath(cut, scd, scd.streams[0]));
  const FaultOutcome c0 = Fault(FaultKind::kKill, SoakRole::kCoordinator, "", "c0:1", 0, 1);
  EXPECT_TRUE(OnPath(c0, local, local.streams[0]));
  EXPECT_FALSE(OnPath(c0, scd, scd.streams[0]));  // sent to the other coordinator
  const FaultOutcome replaced =
      Fault(FaultKind::kReplace, SoakRole::kCoordinator, "", "c1:1", 0, 1);
  EXPECT_TRUE(OnPath(replaced, scd, scd.streams[0]));
  const FaultOutcome etcd = Fault(FaultKind::kEtcd, SoakRole::kEtcd, "", "", 0, 1);
  EXPECT_TRUE(OnPath(etcd, local, local.streams[0]));
  SoakRecord resumed = scd;  // sent to c1, resumed through c0
  resumed.resumed_via = {"c0:1"};
  EXPECT_TRUE(OnPath(c0, resumed, resumed.streams[0]));
}

// Issue 50's contract: a failure is explained only where no live replica, producer or
// coordinator could have carried the stream.
TEST(SoakCheckTest, AFailureIsExplainedOnlyWhereNothingLiveCouldHaveCarriedIt) {
  const SoakReplicas replicas = {{"fables", 2}, {"xs", 1}};
  const absl::Duration bound = absl::Seconds(1);
  auto judged = [&](const SoakRecord& r, const std::vector<FaultOutcome>& faults) {
    return JudgeStream(r, r.streams[0], FaultWindows(faults, At(100), absl::Seconds(2)), bound,
                       replicas)
        .outcome;
  };
  const FaultOutcome fables_1 =
      Fault(FaultKind::kKill, SoakRole::kConsumer, "fables", "f1:1", 10, 20);
  const FaultOutcome fables_2 =
      Fault(FaultKind::kFreeze, SoakRole::kConsumer, "fables", "f2:1", 14, 18);
  const SoakRecord fables = Record("local", "fables", 15, 16, kUnavailable);
  EXPECT_EQ(judged(fables, {fables_1}), StreamOutcome::kUnexplained);  // the other replica lived
  EXPECT_EQ(judged(fables, {fables_1, fables_2}), StreamOutcome::kExplained);  // both down
  const SoakRecord before = Record("local", "fables", 11, 13, kUnavailable);
  EXPECT_EQ(judged(before, {fables_1, fables_2}), StreamOutcome::kUnexplained);  // one was up
  const SoakRecord xs = Record("local", "xs", 15, 16, kUnavailable);
  EXPECT_EQ(judged(xs, {Fault(FaultKind::kKill, SoakRole::kConsumer, "xs", "x:1", 10, 20)}),
            StreamOutcome::kExplained);  // its only consumer

  // The producer's death, its link's flap or cut: only for a request that forbade the fallback.
  SoakRecord scd = Record("scd", "xs", 15, 16, kUnavailable);
  const FaultOutcome producer = Fault(FaultKind::kKill, SoakRole::kProducer, "", "p:1", 10, 20);
  const FaultOutcome flap = Fault(FaultKind::kFlap, SoakRole::kEtcd, "", "", 10, 20);
  const FaultOutcome cut = Fault(FaultKind::kLinkDown, SoakRole::kProducer, "", "p:1", 10, 20);
  EXPECT_EQ(judged(scd, {producer}), StreamOutcome::kUnexplained);
  EXPECT_EQ(judged(scd, {flap}), StreamOutcome::kUnexplained);
  EXPECT_EQ(judged(scd, {cut}), StreamOutcome::kUnexplained);
  scd.spec.forbid_fallback = true;
  EXPECT_EQ(judged(scd, {producer}), StreamOutcome::kExplained);
  EXPECT_EQ(judged(scd, {flap}), StreamOutcome::kExplained);
  EXPECT_EQ(judged(scd, {cut}), StreamOutcome::kExplained);

  // A coordinator's kill or replacement: only where the client could not resume.
  const FaultOutcome c0 = Fault(FaultKind::kKill, SoakRole::kCoordinator, "", "c0:1", 10, 20);
  SoakRecord via_c0 = Record("local", "xs", 15, 16, kUnavailable, "c0:1");
  EXPECT_EQ(judged(via_c0, {c0}), StreamOutcome::kUnexplained);
  via_c0.resume_blocked = "no resume token";
  EXPECT_EQ(judged(via_c0, {c0}), StreamOutcome::kExplained);
  const FaultOutcome replaced =
      Fault(FaultKind::kReplace, SoakRole::kCoordinator, "", "c0:1", 10, 20);
  EXPECT_EQ(judged(via_c0, {replaced}), StreamOutcome::kExplained);
  // Resumed through c1, which died too, with no resume left: c1's kill explains it.
  SoakRecord resumed = Record("local", "xs", 15, 16, kUnavailable, "c0:1");
  resumed.resumed_via = {"c1:1"};
  resumed.resume_blocked = "no other live coordinator";
  const FaultOutcome c1 = Fault(FaultKind::kKill, SoakRole::kCoordinator, "", "c1:1", 14, 20);
  EXPECT_EQ(judged(resumed, {c1}), StreamOutcome::kExplained);
  // A frozen coordinator holds its streams: explained when it was on the path.
  const FaultOutcome frozen = Fault(FaultKind::kFreeze, SoakRole::kCoordinator, "", "c0:1", 10, 20);
  EXPECT_EQ(judged(Record("local", "xs", 15, 16, kUnavailable, "c0:1"), {frozen}),
            StreamOutcome::kExplained);
  EXPECT_EQ(judged(Record("local", "xs", 15, 16, kUnavailable, "c1:1"), {frozen}),
            StreamOutcome::kUnexplained);

  // etcd's restart explains nothing, but excuses lateness like every fault on the path.
  SoakRecord late = Record("local", "xs", 15, 40, kUnavailable);
  late.spec.deadline_ms = 1000;
  const std::vector<FaultWindow> etcd = FaultWindows(
      {Fault(FaultKind::kEtcd, SoakRole::kEtcd, "", "", 10, 20)}, At(100), absl::Seconds(2));
  const StreamJudgement j = JudgeStream(late, late.streams[0], etcd, bound, replicas);
  EXPECT_EQ(j.outcome, StreamOutcome::kUnexplained);
  EXPECT_FALSE(j.deadline_overrun);
}

// A fan-out refused as a whole (UNAVAILABLE: one target has no live consumer; inference.proto)
// fails every target's stream: the fault on any target is on each stream's path. Once the
// targets started, one target's consumer is not on another's path.
TEST(SoakCheckTest, AFanOutRefusedAsAWholeFailsOnAnyOfItsTargetsConsumers) {
  SoakRecord refused = Record("scd", "fables", 0, 1, kUnavailable);
  refused.spec.targets.push_back("xs");
  refused.streams.push_back(refused.streams[0]);
  refused.streams[1].target = "xs";
  refused.rpc_code = kUnavailable;
  for (SoakStream& s : refused.streams) s.terminals = 0;  // the call's status, no event
  const FaultOutcome xs = Fault(FaultKind::kKill, SoakRole::kConsumer, "xs", "x:1", 0, 1);
  EXPECT_TRUE(OnPath(xs, refused, refused.streams[0]));
  EXPECT_TRUE(OnPath(xs, refused, refused.streams[1]));
  const FaultOutcome other = Fault(FaultKind::kKill, SoakRole::kConsumer, "other", "o:1", 0, 1);
  EXPECT_FALSE(OnPath(other, refused, refused.streams[0]));  // not one of its targets

  SoakRecord started = refused;
  started.rpc_code = 0;
  for (SoakStream& s : started.streams) {
    s.started = 1;
    s.terminals = 1;
  }
  EXPECT_FALSE(OnPath(xs, started, started.streams[0]));  // fables's stream ran on its own
  EXPECT_TRUE(OnPath(xs, started, started.streams[1]));
}

TEST(SoakCheckTest, EachStreamEndsInOneOutcome) {
  const std::vector<FaultWindow> windows =
      FaultWindows({Fault(FaultKind::kKill, SoakRole::kConsumer, "fables", "f:1", 10, 20)}, At(100),
                   absl::Seconds(2));
  const absl::Duration bound = absl::Seconds(1);
  // Finished.
  EXPECT_EQ(JudgeStream(Record("local", "fables", 11, 12, 0),
                        Record("local", "fables", 11, 12, 0).streams[0], windows, bound)
                .outcome,
            StreamOutcome::kOk);
  // Failed inside the window, on its path: explained, naming the fault.
  SoakRecord failed = Record("local", "fables", 15, 16, kUnavailable);
  StreamJudgement j = JudgeStream(failed, failed.streams[0], windows, bound);
  EXPECT_EQ(j.outcome, StreamOutcome::kExplained);
  EXPECT_EQ(j.explained_by, "kill consumer node");
  // Sent after the window closed (recovered at 20, grace 2): unexplained.
  failed = Record("local", "fables", 22.5, 23, kUnavailable);
  EXPECT_EQ(JudgeStream(failed, failed.streams[0], windows, bound).outcome,
            StreamOutcome::kUnexplained);
  // Inside the window but another model: unexplained.
  failed = Record("local", "xs", 15, 16, kUnavailable);
  EXPECT_EQ(JudgeStream(failed, failed.streams[0], windows, bound).outcome,
            StreamOutcome::kUnexplained);
  // Ended by its own client.
  SoakRecord cancelled =
      Record("scd", "xs", 50, 50.1, static_cast<int>(absl::StatusCode::kCancelled));
  cancelled.client_ended = true;
  EXPECT_EQ(JudgeStream(cancelled, cancelled.streams[0], windows, bound).outcome,
            StreamOutcome::kClientEnded);
  // A short deadline that ended it in time; and one that ended it too late.
  const int deadline = static_cast<int>(absl::StatusCode::kDeadlineExceeded);
  SoakRecord short_deadline = Record("scd", "xs", 50, 50.3, deadline);
  short_deadline.spec.short_deadline = true;
  short_deadline.spec.deadline_ms = 200;
  j = JudgeStream(short_deadline, short_deadline.streams[0], windows, bound);
  EXPECT_EQ(j.outcome, StreamOutcome::kDeadline);
  EXPECT_FALSE(j.deadline_overrun);
  short_deadline.ended = At(51.5);  // 1.3 s past its 200 ms
  j = JudgeStream(short_deadline, short_deadline.streams[0], windows, bound);
  EXPECT_EQ(j.outcome, StreamOutcome::kUnexplained);
  EXPECT_TRUE(j.deadline_overrun);
  // Late but with a fault on its path: excused.
  SoakRecord late = Record("local", "fables", 12, 40, kUnavailable);
  late.spec.deadline_ms = 1000;
  j = JudgeStream(late, late.streams[0], windows, bound);
  EXPECT_EQ(j.outcome, StreamOutcome::kExplained);
  EXPECT_FALSE(j.deadline_overrun);
}

TEST(SoakCheckTest, TheTallyCountsOutcomesTokensFallbacksMovesAndTheirPeriods) {
  const std::vector<FaultWindow> windows = FaultWindows(
      {Fault(FaultKind::kFreeze, SoakRole::kProducer, "", "", 10, 20)}, At(100), absl::Seconds(2));
  std::vector<SoakRecord> records;
  SoakRecord ok = Record("scd", "xs", 1, 2, 0);
  ok.streams[0].ttft_s = 0.010;
  ok.streams[0].compared = true;
  records.push_back(ok);
  SoakRecord wrong = Record("scd", "xs", 3, 4, 0);
  wrong.streams[0].compared = true;
  wrong.streams[0].tokens.ok = false;
  wrong.violations.push_back("xs: token 2 differs");
  records.push_back(wrong);
  SoakRecord fell_back = Record("scd", "xs", 12, 13, 0);  // during the freeze
  fell_back.streams[0].started_mode = "scd";
  fell_back.streams[0].mode = "local";
  fell_back.streams[0].ttft_s = 1.5;
  records.push_back(fell_back);
  SoakRecord moved = Record("local", "fables", 60, 61, 0);  // moved once, then resumed once
  moved.streams[0].moves = 2;
  moved.streams[0].resumes = 1;
  records.push_back(moved);
  SoakRecord silent = Record("local", "fables", 50, 51, 0);  // the call ended OK, no terminal
  silent.streams[0].finished = false;
  silent.streams[0].terminals = 0;
  records.push_back(silent);
  const SoakTally t = TallySoak(records, windows, absl::Seconds(1));
  EXPECT_EQ(t.requests, 5);
  EXPECT_EQ(t.streams, 5);
  EXPECT_EQ(t.outcomes.at("ok"), 4);
  EXPECT_EQ(t.outcomes.at("unexplained"), 1);
  EXPECT_EQ(t.compared, 2);
  EXPECT_EQ(t.wrong_tokens, 1);
  EXPECT_EQ(t.violations, 1);
  EXPECT_EQ(t.fallbacks, 1);
  EXPECT_EQ(t.moved, 1);
  EXPECT_EQ(t.moves, 2);
  EXPECT_EQ(t.resumed, 1);
  EXPECT_EQ(t.resumes, 1);
  EXPECT_EQ(t.no_terminal, 1);
  EXPECT_EQ(t.ttft_steady.count, 1);
  EXPECT_EQ(t.ttft_faults.count, 1);
  EXPECT_DOUBLE_EQ(t.ttft_faults.median, 1500);
  EXPECT_FALSE(t.examples.empty());
}

}  // namespace
}  // namespace scd::bench

namespace scd::bench {
namespace {

// Samples every 2 s at 6 requests/s of a process growing `mb_per_1k` MiB per 1,000 requests,
// sawing by `saw_mb` (a trim every 10 s hands back what accumulated); half the growth in
// anonymous pages, the other half in file-backed ones.
std::vector<RssPoint> Growing(int generation, double start_s, int samples, double mb_per_1k,
                              double saw_mb) {
  std::vector<RssPoint> points;
  for (int i = 0; i < samples; ++i) {
    RssPoint p;
    p.generation = generation;
    p.at = At(start_s + 2.0 * i);
    p.requests = static_cast<int64_t>((start_s + 2.0 * i) * 6);
    const double saw = saw_mb * static_cast<double>(i % 5) / 4;  // up for 10 s, then back
    p.rss = static_cast<int64_t>((200 + static_cast<double>(p.requests) * mb_per_1k / 1000 + saw) *
                                 (1 << 20));
    p.anon = static_cast<int64_t>((80 + static_cast<double>(p.requests) * mb_per_1k / 2000 + saw) *
                                  (1 << 20));
    points.push_back(p);
  }
  return points;
}

TEST(SoakCheckTest, RssGrowthIsTheSlopeOverTheLongestLivedIncarnationAfterItsFirstQuarter) {
  std::vector<RssPoint> points = Growing(0, 0, 60, 5.0, 0);              // 2 minutes, steep
  const std::vector<RssPoint> longest = Growing(1, 200, 300, 0.4, 3.0);  // 10 minutes, sawing
  points.insert(points.end(), longest.begin(), longest.end());
  const RssGrowth growth = MeasureRssGrowth(points);
  EXPECT_EQ(growth.generation, 1);
  EXPECT_NEAR(growth.mb_per_1k, 0.4, 0.05);  // the saw's 3 MB over ~2,700 requests would be 1.1
  EXPECT_NEAR(growth.anon_mb_per_1k, 0.2, 0.05);
  const int64_t from = longest[longest.size() / 4].requests;
  EXPECT_EQ(growth.requests, longest.back().requests - from);
}

TEST(SoakCheckTest, AWarmUpInTheFirstQuarterIsNotGrowth) {
  std::vector<RssPoint> points = Growing(0, 0, 200, 0, 0);
  for (size_t i = 0; i < 30; ++i) points[i].rss -= (30 - static_cast<int64_t>(i)) << 20;  // filling
  EXPECT_NEAR(MeasureRssGrowth(points).mb_per_1k, 0, 1e-9);
}

TEST(SoakCheckTest, TooFewSamplesMeasureNothing) {
  const RssGrowth growth = MeasureRssGrowth(Growing(0, 0, 5, 3, 0));
  EXPECT_EQ(growth.requests, 0);
  EXPECT_EQ(growth.mb_per_1k, 0);
}

}  // namespace
}  // namespace scd::bench
