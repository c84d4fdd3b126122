#include "bench/kill_bench.h"

#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "bench/soak_deployment.h"
#include "bench/soak_workload.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

constexpr char kModel[] = "fables";
constexpr absl::Duration kStreamTimeout = absl::Seconds(40);
constexpr absl::Duration kRoutingWait = absl::Seconds(20);

// Round `round`'s request and what it is (local and raw in turn; greedy and seeded in turn).
v1::GenerateRequest RoundRequest(const KillBenchOptions& o, const std::vector<std::string>& prompts,
                                 int round, KillRound* r) {
  r->prompt = round % static_cast<int>(prompts.size());
  r->mode = round % 2 == 0 ? "local" : "raw";
  r->greedy = (round / 2) % 2 == 0;
  v1::GenerateRequest q;
  q.set_prompt(prompts[static_cast<size_t>(r->prompt)]);
  q.add_targets(kModel);
  SetRequestModeName(r->mode, &q);
  q.set_max_tokens(o.max_tokens);
  q.set_deadline_ms(30000);
  q.set_request_id(absl::StrCat("kill-", round));
  if (!r->greedy) {
    q.set_temperature(0.8f);
    q.set_top_p(0.9f);
    q.set_seed(1000 + static_cast<uint64_t>(round));
  }
  return q;
}

// One stream as the client sees it, filled from the reader's thread.
struct Followed {
  std::mutex mu;
  std::vector<int32_t> ids;
  std::vector<absl::Time> token_at;    // per token event
  std::vector<size_t> ids_before;      // per token event: ids that came before it
  std::vector<size_t> tokens_at_move;  // ids.size() at each Moved
  bool finished = false;
  std::string error;
};

void Take(const v1::GenerateEvent& e, Followed& f) {
  std::lock_guard<std::mutex> lock(f.mu);
  if (e.has_token() && e.token().ids_size() > 0) {
    f.ids_before.push_back(f.ids.size());
    f.ids.insert(f.ids.end(), e.token().ids().begin(), e.token().ids().end());
    f.token_at.push_back(absl::Now());
  } else if (e.has_moved()) {
    f.tokens_at_move.push_back(f.ids.size());
  } else if (e.has_finished()) {
    f.finished = true;
  } else if (e.has_error()) {
    f.error = e.error().message();
  }
}

// The consumer replica decoding a sequence now (-1: none).
int Decoding(const SoakDeployment& d, const std::vector<int>& replicas) {
  for (int i : replicas) {
    const absl::StatusOr<v1::NodeStats> stats = d.Stats(i);
    if (stats.ok() && stats->sequences() > 0) return i;
  }
  return -1;
}

// Polls `done` every 10 ms, at most `limit`: seconds until it held, -1 if it never did.
double SecondsUntil(const std::function<bool()>& done, absl::Time from, absl::Duration limit) {
  for (;;) {
    if (done()) return absl::ToDoubleSeconds(absl::Now() - from);
    if (absl::Now() - from > limit) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// The gap the first move left: the last token before it to the first after it (-1: none).
double MoveGap(const Followed& f) {
  if (f.tokens_at_move.empty()) return -1;
  for (size_t k = 1; k < f.token_at.size(); ++k) {
    if (f.ids_before[k] >= f.tokens_at_move[0]) {
      return absl::ToDoubleSeconds(f.token_at[k] - f.token_at[k - 1]);
    }
  }
  return -1;  // no token before the move, or none after it
}

void Tally(KillBenchReport& report) {
  std::vector<double> gaps, out, again;
  for (const KillRound& r : report.rounds) {
    if (!r.killed) continue;
    ++report.killed;
    report.moved += r.moves > 0;
    report.finished += r.finished;
    report.equal += r.finished && r.equal;
    if (r.gap_s >= 0) gaps.push_back(r.gap_s);
    if (r.out_of_routing_s >= 0) out.push_back(r.out_of_routing_s);
    if (r.routed_again_s >= 0) again.push_back(r.routed_again_s);
  }
  const std::vector<double> p = {50, 90, 99};
  report.gap = Summarize(gaps, p);
  report.out_of_routing = Summarize(out, p);
  report.routed_again = Summarize(again, p);
}

double P99(const MetricSummary& m) { return m.percentiles.count(99) ? m.percentiles.at(99) : 0; }

}  // namespace

// One round: the reference, then the stream with its replica killed at its first token.
KillRound RunKillRound(SoakDeployment& d, const std::string& coordinator,
                       const std::vector<int>& replicas, const KillBenchOptions& o,
                       const std::vector<std::string>& prompts, int round) {
  KillRound r;
  const v1::GenerateRequest request = RoundRequest(o, prompts, round, &r);
  std::vector<int32_t> reference;
  const absl::Status ref =
      StreamGenerate(coordinator, request, kStreamTimeout, [&](const v1::GenerateEvent& e) {
        if (e.has_token())
          reference.insert(reference.end(), e.token().ids().begin(), e.token().ids().end());
      });
  r.reference_tokens = static_cast<int>(reference.size());
  if (!ref.ok()) {
    r.error = absl::StrCat("the unfaulted run failed: ", ref.message());
    return r;
  }
  Followed f;
  absl::Notification first_token;
  bool notified = false;  // the reader's thread only
  absl::Status status;
  std::thread reader([&] {
    status = StreamGenerate(coordinator, request, kStreamTimeout, [&](const v1::GenerateEvent& e) {
      Take(e, f);
      if (e.has_token() && !notified) {
        notified = true;
        first_token.Notify();
      }
    });
    if (!notified) first_token.Notify();
  });
  first_token.WaitForNotification();
  const int victim = Decoding(d, replicas);
  SoakNode as_was;
  absl::Time killed_at;
  if (victim >= 0) {
    as_was = d.Node(victim);
    {
      std::lock_guard<std::mutex> lock(f.mu);
      r.tokens_before_kill = static_cast<int>(f.ids.size());
    }
    killed_at = absl::Now();
    d.Kill(victim);
    r.killed = true;
    r.victim = as_was.name;
    r.out_of_routing_s =
        SecondsUntil([&] { return d.RoutedEverywhere(as_was, false); }, killed_at, kRoutingWait);
  }
  reader.join();
  r.moves = static_cast<int>(f.tokens_at_move.size());
  r.finished = f.finished && status.ok();
  if (!status.ok() && f.error.empty()) f.error = std::string(status.message());
  r.error = f.error;
  r.gap_s = MoveGap(f);
  r.tokens = static_cast<int>(f.ids.size());
  r.equal = f.ids == reference;
  if (victim >= 0) {
    absl::StatusOr<absl::Time> ready = d.Restart(victim);
    if (!ready.ok()) {
      r.error =
          absl::StrCat(r.error, r.error.empty() ? "" : "; ", "restart: ", ready.status().message());
    } else {
      const SoakNode back = d.Node(victim);
      r.routed_again_s =
          SecondsUntil([&] { return d.RoutedEverywhere(back, true); }, *ready, kRoutingWait);
    }
  }
  return r;
}

bool KillBenchReport::pass() const {
  return killed >= options.kills && moved == killed && equal == killed && gap.count == killed &&
         P99(gap) <= absl::ToDoubleMilliseconds(options.gap_bound);
}

absl::StatusOr<KillBenchReport> RunKillBench(const KillBenchOptions& o) {
  if (o.kills < 1 || o.max_tokens < 2) {
    return absl::InvalidArgumentError("kills: --kills must be positive and --max-tokens >= 2");
  }
  const std::string models = o.shared_dir + "/models/";
  SCD_ASSIGN_OR_RETURN(std::vector<std::string> prompts,
                       SoakPrompts(o.shared_dir + "/data/tinystories_train_prompts.txt", 4, 6));
  SoakDeploymentSpec spec;
  spec.bin_dir = o.bin_dir;
  spec.dir = o.out + "/nodes";
  spec.producer_model = models + "stories260k";
  spec.transport = o.transport;
  spec.coordinators = 1;
  spec.consumers = {{kModel, models + "stories260k-fables", ""},
                    {kModel, models + "stories260k-fables", ""}};
  std::filesystem::create_directories(spec.dir);
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<SoakDeployment> d, SoakDeployment::Start(spec));
  std::vector<int> replicas;
  std::string coordinator;
  for (int i = 0; i < d->size(); ++i) {
    if (d->Node(i).role == SoakRole::kConsumer) replicas.push_back(i);
    if (d->Node(i).role == SoakRole::kCoordinator) coordinator = d->Node(i).address;
  }
  KillBenchReport report;
  report.options = o;
  Progress bar("kills", o.kills, o.progress);
  // A round whose stream ended before its replica showed the sequence kills nothing; at most
  // three rounds per kill asked.
  int killed = 0;
  for (int round = 0; killed < o.kills && round < 3 * o.kills; ++round) {
    report.rounds.push_back(RunKillRound(*d, coordinator, replicas, o, prompts, round));
    if (report.rounds.back().killed) {
      ++killed;
      bar.Advance();
    }
  }
  bar.Done();
  Tally(report);
  return report;
}

std::string KillBenchJson(const KillBenchReport& report) {
  using Json = nlohmann::json;
  auto summary = [](const MetricSummary& m) {
    return Json{{"count", m.count},
                {"median_ms", m.median},
                {"p90_ms", m.percentiles.count(90) ? m.percentiles.at(90) : 0},
                {"p99_ms", P99(m)}};
  };
  Json rounds = Json::array();
  for (const KillRound& r : report.rounds) {
    rounds.push_back({{"prompt", r.prompt},
                      {"mode", r.mode},
                      {"greedy", r.greedy},
                      {"killed", r.killed},
                      {"victim", r.victim},
                      {"tokens_before_kill", r.tokens_before_kill},
                      {"moves", r.moves},
                      {"finished", r.finished},
                      {"error", r.error},
                      {"gap_ms", r.gap_s >= 0 ? r.gap_s * 1e3 : -1.0},
                      {"equal", r.equal},
                      {"tokens", r.tokens},
                      {"reference_tokens", r.reference_tokens},
                      {"out_of_routing_s", r.out_of_routing_s},
                      {"routed_again_s", r.routed_again_s}});
  }
  const Json j = {{"verdict", report.pass() ? "pass" : "fail"},
                  {"kills_asked", report.options.kills},
                  {"transport", report.options.transport},
                  {"max_tokens", report.options.max_tokens},
                  {"gap_bound_ms", absl::ToDoubleMilliseconds(report.options.gap_bound)},
                  {"killed", report.killed},
                  {"moved", report.moved},
                  {"finished", report.finished},
                  {"equal", report.equal},
                  {"gap", summary(report.gap)},
                  {"out_of_routing", summary(report.out_of_routing)},
                  {"routed_again", summary(report.routed_again)},
                  {"rounds", rounds}};
  return j.dump(1);
}

std::string KillBenchSummary(const KillBenchReport& r) {
  std::string out = absl::StrFormat(
      "kills: %s -- %d replicas killed mid-decode (%d rounds): %d moved, %d finished, %d equal "
      "to the unfaulted run\n",
      r.pass() ? "PASS" : "FAIL", r.killed, static_cast<int>(r.rounds.size()), r.moved, r.finished,
      r.equal);
  absl::StrAppendFormat(
      &out, "  the move's gap in the stream, ms: p50 %.1f  p90 %.1f  p99 %.1f (bound %.0f)\n",
      r.gap.median, r.gap.percentiles.count(90) ? r.gap.percentiles.at(90) : 0, P99(r.gap),
      absl::ToDoubleMilliseconds(r.options.gap_bound));
  absl::StrAppendFormat(&out,
                        "  out of routing after the kill, ms: p50 %.0f  p99 %.0f; routed again "
                        "after its restart, ms: p50 %.0f  p99 %.0f\n",
                        r.out_of_routing.median, P99(r.out_of_routing), r.routed_again.median,
                        P99(r.routed_again));
  for (const KillRound& k : r.rounds) {
    if (k.killed && (k.moves == 0 || !k.finished || !k.equal)) {
      absl::StrAppendFormat(&out, "  ! prompt %d %s %s: %d moves, %s, %d of %d tokens%s%s\n",
                            k.prompt, k.mode, k.greedy ? "greedy" : "seeded", k.moves,
                            k.finished ? "finished" : "not finished", k.tokens, k.reference_tokens,
                            k.equal ? "" : ", tokens differ",
                            k.error.empty() ? "" : ": " + k.error);
    }
  }
  return out;
}

}  // namespace scd::bench
