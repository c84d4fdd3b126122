#include "bench/sim_validation.h"

#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/prefix_hash.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

// `n` ids uniform in [first_id, vocab_size) from `seed`.
std::vector<int32_t> Ids(uint64_t seed, int64_t n, int vocab_size, int first_id) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(first_id, vocab_size - 1);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& v : out) v = id(rng);
  return out;
}

// Seeds of a group's prefix ids and of a request's own: distinct streams per workload seed.
uint64_t GroupSeed(uint64_t workload_seed, int64_t tenant, int64_t group) {
  return SimKey({3, workload_seed, static_cast<uint64_t>(tenant), static_cast<uint64_t>(group)});
}
uint64_t OwnSeed(uint64_t workload_seed, uint64_t id) { return SimKey({4, workload_seed, id}); }

// The figures from per-request (ttft, tpot) of finished requests.
RunFigures Figures(int64_t requests, const std::vector<std::pair<double, double>>& finished,
                   const SimWorkload& w) {
  RunFigures f;
  f.requests = requests;
  std::vector<double> ttft, tpot;
  for (const auto& [t, p] : finished) {
    ++f.completed;
    f.good += MeetsSlo(w, t, p) ? 1 : 0;
    ttft.push_back(t);
    tpot.push_back(p);
  }
  f.goodput = static_cast<double>(f.good) / w.duration_s;
  const MetricSummary t = Summarize(ttft, {50, 90}), p = Summarize(tpot, {50, 90});
  if (!ttft.empty()) {
    f.ttft_p50_ms = t.percentiles.at(50);
    f.ttft_p90_ms = t.percentiles.at(90);
    f.tpot_p50_ms = p.percentiles.at(50);
    f.tpot_p90_ms = p.percentiles.at(90);
  }
  return f;
}

}  // namespace

absl::StatusOr<SimReplay> ReplayOf(const std::vector<SimRequest>& requests, const SimWorkload& w,
                                   int vocab_size, int first_id) {
  if (w.mix.empty()) return absl::InvalidArgumentError("the workload has no mix");
  SimReplay replay;
  replay.target = w.mix[0].target;
  for (const SimMix& m : w.mix) {
    if (m.target != replay.target) {
      return absl::InvalidArgumentError(
          absl::StrCat("a replay sends every request to one consumer pool; the mix names ",
                       replay.target, " and ", m.target));
    }
  }
  if (vocab_size <= first_id + 1) {
    return absl::InvalidArgumentError(absl::StrCat("a vocabulary of ", vocab_size, " ids"));
  }
  for (const SimRequest& r : requests) {
    BenchPrompt p;
    const int64_t shared = r.shared_blocks * kPrefixBlockTokens;
    if (shared > 0) p.ids = Ids(GroupSeed(w.seed, r.tenant, r.group), shared, vocab_size, first_id);
    const std::vector<int32_t> own =
        Ids(OwnSeed(w.seed, r.id), r.prompt_tokens - shared, vocab_size, first_id);
    p.ids.insert(p.ids.end(), own.begin(), own.end());
    p.mode = RequestedModeName(w.mix[r.mix].mode);
    p.output_len = static_cast<int>(r.output_tokens);
    p.cache_salt = absl::StrCat("tenant-", r.tenant);
    replay.prompts.push_back(std::move(p));
    replay.arrivals_s.push_back(r.arrival_s);
  }
  return replay;
}

RunFigures FiguresOf(const ServeBenchResult& real, const SimWorkload& w) {
  std::vector<std::pair<double, double>> finished;
  std::map<std::string, int64_t> modes;
  for (const StreamRecord& s : real.streams) {
    if (!s.ok || s.output_tokens == 0) continue;
    finished.emplace_back(s.ttft_s, s.tpot_s());
    ++modes[RanModeName(s.finished)];
  }
  RunFigures f = Figures(real.requests, finished, w);
  f.modes = std::move(modes);
  return f;
}

RunFigures FiguresOf(const ClusterSimResult& simulated, const SimWorkload& w) {
  std::vector<std::pair<double, double>> finished;
  std::map<std::string, int64_t> modes;
  for (const SimRequestResult& q : simulated.requests) {
    if (q.code != absl::StatusCode::kOk) continue;
    finished.emplace_back(q.ttft_s, q.tpot_s());
    ++modes[TransferModeName(q.mode)];
  }
  RunFigures f = Figures(static_cast<int64_t>(simulated.requests.size()), finished, w);
  f.modes = std::move(modes);
  return f;
}

std::vector<std::pair<std::string, double>> FigureValues(const RunFigures& f) {
  return {{"goodput", f.goodput},
          {"ttft_p50", f.ttft_p50_ms},
          {"ttft_p90", f.ttft_p90_ms},
          {"tpot_p50", f.tpot_p50_ms},
          {"tpot_p90", f.tpot_p90_ms}};
}

std::vector<FigureError> CompareFigures(const RunFigures& real, const RunFigures& simulated) {
  std::vector<FigureError> out;
  const auto r = FigureValues(real), s = FigureValues(simulated);
  for (size_t i = 0; i < r.size(); ++i) {
    FigureError e;
    e.figure = r[i].first;
    e.real = r[i].second;
    e.simulated = s[i].second;
    e.bound = i == 0 ? kGoodputBound : kLatencyBound;
    if (e.real == 0) {
      e.error = e.simulated == 0 ? 0 : 1;
    } else {
      e.error = std::abs(e.simulated - e.real) / std::abs(e.real);
    }
    out.push_back(e);
  }
  return out;
}

std::vector<FigureSpread> SpreadOf(const std::vector<RunFigures>& runs) {
  std::vector<FigureSpread> out;
  if (runs.empty()) return out;
  const size_t figures = FigureValues(runs[0]).size();
  for (size_t i = 0; i < figures; ++i) {
    FigureSpread s;
    s.figure = FigureValues(runs[0])[i].first;
    double sum = 0, squares = 0;
    for (const RunFigures& f : runs) sum += FigureValues(f)[i].second;
    s.mean = sum / static_cast<double>(runs.size());
    for (const RunFigures& f : runs) squares += std::pow(FigureValues(f)[i].second - s.mean, 2);
    s.std = runs.size() > 1 ? std::sqrt(squares / static_cast<double>(runs.size() - 1)) : 0;
    out.push_back(s);
  }
  return out;
}

}  // namespace scd::bench
