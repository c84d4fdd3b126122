// soak.json and the stdout summary of a soak run (bench/soak.h).
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/soak.h"

namespace scd::bench {
namespace {

using Json = nlohmann::ordered_json;

double Since(absl::Time t, absl::Time origin) {
  return t == absl::InfinitePast() ? -1 : absl::ToDoubleSeconds(t - origin);
}

Json Summary(const MetricSummary& m) {
  Json j = {{"count", m.count}, {"mean_ms", m.mean}, {"median_ms", m.median}};
  for (const auto& [p, v] : m.percentiles) j[absl::StrCat("p", p, "_ms")] = v;
  return j;
}

Json Sample(const ProcSample& s) {
  return {{"fds", s.fds},
          {"threads", s.threads},
          {"grpc_pool_threads", s.grpc_threads},
          {"rss_mb", s.rss_bytes / 1048576.0},
          {"rss_anon_mb", s.rss_anon_bytes / 1048576.0},
          {"fd_kinds", s.fd_kinds},
          {"thread_names", s.thread_names}};
}

}  // namespace

std::string SoakJson(const SoakReport& r) {
  const SoakOptions& o = r.options;
  const SoakTally& t = r.tally;
  Json j;
  j["verdict"] = r.pass() ? "pass" : "fail";
  j["failures"] = r.failures;
  j["options"] = {{"duration_s", absl::ToDoubleSeconds(o.duration)},
                  {"rate", o.rate},
                  {"seed", o.seed},
                  {"fault_gap_s", absl::ToDoubleSeconds(o.fault_gap)},
                  {"transport", o.transport},
                  {"link", o.link},
                  {"deadline_bound_ms", absl::ToDoubleMilliseconds(o.deadline_bound)},
                  {"grace_s", absl::ToDoubleSeconds(o.grace)},
                  {"rss_min_requests", o.rss_min_requests},
                  {"rss_bound_mb_per_1k", o.rss_bound_mb_per_1k}};
  j["load_s"] = absl::ToDoubleSeconds(r.load_end - r.load_start);
  j["settle_s"] = r.settle_s;
  j["levels_back_s"] = r.levels_back_s;
  j["tally"] = {{"requests", t.requests},
                {"streams", t.streams},
                {"outcomes", t.outcomes},
                {"failure_codes", t.failure_codes},
                {"explained_by", t.explained_by_kind},
                {"compared", t.compared},
                {"wrong_tokens", t.wrong_tokens},
                {"near_tie_partings", t.near_tie_partings},
                {"lowered_not_compared", t.lowered},
                {"fallbacks", t.fallbacks},
                {"moved", t.moved},
                {"moves", t.moves},
                {"resumed", t.resumed},
                {"resumes", t.resumes},
                {"move_gap", Summary(t.move_gap)},
                {"violations", t.violations},
                {"no_terminal", t.no_terminal},
                {"deadline_overruns", t.deadline_overruns},
                {"max_deadline_overrun_ms_steady", t.max_deadline_overrun_ms},
                {"ttft_steady", Summary(t.ttft_steady)},
                {"ttft_faults", Summary(t.ttft_faults)},
                {"itl_steady", Summary(t.itl_steady)},
                {"itl_faults", Summary(t.itl_faults)},
                {"examples", t.examples}};
  j["fault_kinds_run"] = r.fault_kinds_run;
  Json faults = Json::array();
  for (const FaultOutcome& f : r.faults) {
    faults.push_back({{"kind", FaultKindName(f.fault.kind)},
                      {"node", f.node},
                      {"role", f.node.empty() ? "link" : SoakRoleName(f.role)},
                      {"start_s", Since(f.start, r.load_start)},
                      {"acted_s", Since(f.acted, r.load_start)},
                      {"recovered_s", Since(f.recovered, r.load_start)},
                      {"hold_s", absl::ToDoubleSeconds(f.fault.hold)},
                      {"out_of_routing_s", f.out_of_routing_s},
                      {"out_of_routing_bound_s", f.out_of_routing_bound_s},
                      {"recovery_s", f.recovery_s},
                      {"recovery_bound_s", f.recovery_bound_s},
                      {"mid_stream", f.mid_stream},
                      {"ok", f.ok()},
                      {"error", f.error}});
  }
  j["faults"] = faults;
  Json nodes = Json::array();
  for (const NodeResources& n : r.nodes) {
    nodes.push_back({{"name", n.name},
                     {"role", SoakRoleName(n.role)},
                     {"generation", n.generation},
                     {"baseline", Sample(n.baseline)},
                     {"end", Sample(n.end)},
                     {"held_nothing", n.held_nothing},
                     {"held", n.held},
                     {"rss_growth_mb_per_1k", n.rss_growth_mb_per_1k},
                     {"rss_anon_growth_mb_per_1k", n.rss_anon_growth_mb_per_1k},
                     {"rss_requests", n.rss_requests},
                     {"rss_generation", n.rss_generation}});
  }
  j["nodes"] = nodes;
  // Per stream, for the timeline: sent and ended (s since the load's start), outcome, TTFT.
  Json rows = Json::array();
  for (const SoakRecord& rec : r.records) {
    for (const SoakStream& s : rec.streams) {
      const StreamJudgement judged = JudgeStream(rec, s, r.windows, o.deadline_bound, r.replicas);
      rows.push_back(
          {Since(rec.sent, r.load_start), Since(rec.ended, r.load_start),
           StreamOutcomeName(judged.outcome), s.ttft_s >= 0 ? s.ttft_s * 1e3 : -1.0, s.target,
           rec.spec.mode, s.mode, judged.explained_by,
           s.finished ? "" : absl::StatusCodeToString(static_cast<absl::StatusCode>(s.code)),
           rec.spec.forbid_fallback, s.moves, s.resumes, rec.resume_blocked});
    }
  }
  // Every request that broke an invariant, whole.
  Json bad = Json::array();
  for (const SoakRecord& rec : r.records) {
    if (rec.violations.empty()) continue;
    Json streams = Json::array();
    for (const SoakStream& s : rec.streams) {
      streams.push_back({{"target", s.target},
                         {"mode", s.mode},
                         {"started_mode", s.started_mode},
                         {"finished", s.finished},
                         {"code", s.code},
                         {"error", s.error},
                         {"reason", s.reason},
                         {"ids", s.ids},
                         {"producer_cached", s.producer_cached},
                         {"consumer_cached", s.consumer_cached},
                         {"payload_bytes", s.payload_bytes},
                         {"moves", s.moves},
                         {"resumes", s.resumes}});
    }
    bad.push_back({{"request_id", rec.spec.request_id},
                   {"coordinator", rec.coordinator},
                   {"resumed_via", rec.resumed_via},
                   {"resume_blocked", rec.resume_blocked},
                   {"sent_s", Since(rec.sent, r.load_start)},
                   {"ended_s", Since(rec.ended, r.load_start)},
                   {"prompt", rec.spec.prompt},
                   {"salt", rec.spec.salt},
                   {"mode", rec.spec.mode},
                   {"greedy", rec.spec.greedy},
                   {"forbid_fallback", rec.spec.forbid_fallback},
                   {"max_tokens", rec.spec.max_tokens},
                   {"violations", rec.violations},
                   {"streams", streams}});
  }
  j["violating_requests"] = bad;
  j["stream_columns"] = {"sent_s", "ended_s",     "outcome",       "ttft_ms", "target",
                         "mode",   "served_mode", "explained_by",  "code",    "forbid_fallback",
                         "moves",  "resumes",     "resume_blocked"};
  j["streams"] = rows;
  return j.dump(1);
}

std::string SoakSummaryText(const SoakReport& r) {
  const SoakTally& t = r.tally;
  auto count = [&](const char* outcome) {
    return t.outcomes.count(outcome) ? t.outcomes.at(outcome) : 0;
  };
  std::string out = absl::StrFormat(
      "soak: %s -- %d requests (%d streams) in %.0f s: ok %d, client-ended %d, deadline %d, "
      "explained %d, unexplained %d\n",
      r.pass() ? "PASS" : "FAIL", t.requests, t.streams,
      absl::ToDoubleSeconds(r.load_end - r.load_start), count("ok"), count("client_ended"),
      count("deadline"), count("explained"), count("unexplained"));
  absl::StrAppendFormat(&out,
                        "  greedy streams compared with their reference: %d (wrong %d, parted "
                        "at a near-tie %d); fallbacks %d; violations %d; no terminal %d; "
                        "deadline overruns %d\n",
                        t.compared, t.wrong_tokens, t.near_tie_partings, t.fallbacks, t.violations,
                        t.no_terminal, t.deadline_overruns);
  absl::StrAppendFormat(&out,
                        "  TTFT p50/p99 ms: steady %.1f / %.1f, during faults %.1f / %.1f; ITL "
                        "p99 ms: steady %.1f, during faults %.1f\n",
                        t.ttft_steady.median,
                        t.ttft_steady.percentiles.count(99) ? t.ttft_steady.percentiles.at(99) : 0,
                        t.ttft_faults.median,
                        t.ttft_faults.percentiles.count(99) ? t.ttft_faults.percentiles.at(99) : 0,
                        t.itl_steady.percentiles.count(99) ? t.itl_steady.percentiles.at(99) : 0,
                        t.itl_faults.percentiles.count(99) ? t.itl_faults.percentiles.at(99) : 0);
  absl::StrAppendFormat(
      &out,
      "  streams moved to another replica: %d (%d moves, of them %d resumes through another "
      "coordinator by %d streams; gap p50/p99 ms %.1f / %.1f)\n",
      t.moved, t.moves, t.resumes, t.resumed, t.move_gap.median,
      t.move_gap.percentiles.count(99) ? t.move_gap.percentiles.at(99) : 0);
  for (const FaultOutcome& f : r.faults) {
    absl::StrAppendFormat(&out,
                          "  %-8s %-14s%s out of routing %5.1f s  serving again %5.2f s  %s%s\n",
                          FaultKindName(f.fault.kind), f.node.empty() ? "link" : f.node,
                          f.mid_stream ? " mid-stream" : "", f.out_of_routing_s, f.recovery_s,
                          f.ok() ? "ok" : "FAIL ", f.error);
  }
  for (const NodeResources& n : r.nodes) {
    absl::StrAppendFormat(&out,
                          "  %-14s gen %d  fds %d -> %d  threads %d -> %d (+ gRPC's %d -> %d)"
                          "  RSS %.1f -> %.1f MB"
                          "  growth %.3f MB/1k req (anonymous %.3f) over %d req%s\n",
                          n.name, n.generation, n.baseline.fds, n.end.fds, n.baseline.own_threads(),
                          n.end.own_threads(), n.baseline.grpc_threads, n.end.grpc_threads,
                          n.baseline.rss_bytes / 1048576.0, n.end.rss_bytes / 1048576.0,
                          n.rss_growth_mb_per_1k, n.rss_anon_growth_mb_per_1k, n.rss_requests,
                          n.held_nothing ? "" : "  HOLDS " + n.held);
  }
  for (const std::string& e : t.examples) absl::StrAppend(&out, "  ! ", e, "\n");
  for (const std::string& f : r.failures) absl::StrAppend(&out, "  FAIL: ", f, "\n");
  return out;
}

}  // namespace scd::bench
