#include "calib/frontier_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "codec/transfer.h"

namespace scd {

namespace {

enum class CodeKind { kKey, kValue, kHidden };

// One code the allocation can lower: a layer's key, value or hidden code.
struct Slot {
  int layer = 0;
  CodeKind kind = CodeKind::kKey;
  std::vector<int64_t> ladder;  // ranks, descending; ladder[0] the artifact's
  int64_t rows = 1;             // code rows per token: kv heads for K/V, 1 for H
  std::vector<double> loss;     // measured KL increase at each rung (loss[0] = 0), non-falling
};

// Payload bytes per code element, scales of int4's groups included (int8's per-row scale does
// not depend on the rank, so the allocation leaves it out).
double ElementBytes(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kInt8:
      return 1.0;
    case WireDtype::kInt4:
      return 0.5 + 4.0 / 32;
    case WireDtype::kF32:
      return 4.0;
    default:
      return 2.0;
  }
}

std::vector<Slot> Slots(const Artifact& artifact, int ladder_steps) {
  std::vector<Slot> slots;
  for (int l = 0; l < static_cast<int>(artifact.layers.size()); ++l) {
    const ArtifactLayer& a = artifact.layers[l];
    if (a.route == LayerRoute::kPatch) {
      slots.push_back({l, CodeKind::kHidden, RankLadder(a.patch->rank(), ladder_steps), 1, {}});
    } else {
      const int64_t heads = artifact.producer.kv_heads;
      slots.push_back(
          {l, CodeKind::kKey, RankLadder(a.key.rank(), ladder_steps), a.key.CodeRows(heads), {}});
      slots.push_back({l,
                       CodeKind::kValue,
                       RankLadder(a.value.rank(), ladder_steps),
                       a.value.CodeRows(heads),
                       {}});
    }
  }
  return slots;
}

// The point that sends slot s at rung rung[s].
AllocatedPoint Allocate(const Artifact& artifact, const std::vector<Slot>& slots,
                        const std::vector<size_t>& rung, double element_bytes) {
  const size_t layers = artifact.layers.size();
  AllocatedPoint p;
  p.rank_k.assign(layers, 0);
  p.rank_v.assign(layers, 0);
  p.rank_h.assign(layers, 0);
  for (size_t s = 0; s < slots.size(); ++s) {
    const Slot& slot = slots[s];
    const int64_t r = slot.ladder[rung[s]];
    (slot.kind == CodeKind::kKey     ? p.rank_k
     : slot.kind == CodeKind::kValue ? p.rank_v
                                     : p.rank_h)[slot.layer] = r;
    p.predicted_kl += slot.loss[rung[s]];
    p.bytes_per_token += static_cast<double>(r * slot.rows) * element_bytes;
  }
  return p;
}

// The greedy path of one precision: from every slot at full rank, one rung at a time, the
// step with the least predicted KL per byte saved. Every point is nested in the ones before it.
std::vector<AllocatedPoint> GreedyPath(const Artifact& artifact, const std::vector<Slot>& slots,
                                       double base_kl, double element_bytes) {
  std::vector<size_t> rung(slots.size(), 0);
  std::vector<AllocatedPoint> path{Allocate(artifact, slots, rung, element_bytes)};
  for (;;) {
    int best = -1;
    double best_cost = std::numeric_limits<double>::infinity();
    for (size_t s = 0; s < slots.size(); ++s) {
      const Slot& slot = slots[s];
      if (rung[s] + 1 >= slot.ladder.size()) continue;
      const double saved =
          static_cast<double>((slot.ladder[rung[s]] - slot.ladder[rung[s] + 1]) * slot.rows) *
          element_bytes;
      const double cost = (slot.loss[rung[s] + 1] - slot.loss[rung[s]]) / saved;
      if (cost < best_cost) {
        best_cost = cost;
        best = static_cast<int>(s);
      }
    }
    if (best < 0) break;
    ++rung[best];
    path.push_back(Allocate(artifact, slots, rung, element_bytes));
  }
  for (AllocatedPoint& p : path) p.predicted_kl += base_kl;
  return path;
}

// `count` indices of `path` spread evenly over its bytes, the first and last included.
std::vector<size_t> Spread(const std::vector<AllocatedPoint>& path, int count) {
  std::vector<size_t> picked;
  const double hi = path.front().bytes_per_token, lo = path.back().bytes_per_token;
  size_t i = 0;
  for (int j = 0; j < count; ++j) {
    const double target = count > 1 ? hi - (hi - lo) * j / (count - 1) : hi;
    while (i + 1 < path.size() && path[i].bytes_per_token > target + 1e-9) ++i;
    if (picked.empty() || picked.back() != i) picked.push_back(i);
  }
  return picked;
}

// Runs scd at given options over the held-out windows: KL, bytes and timings as a point.
class PointMeasurer {
 public:
  PointMeasurer(const LlamaModel& producer, const LlamaModel& consumer, const Artifact& artifact,
                const FidelityEvaluator& heldout, Progress* progress, int* evaluations)
      : producer_(producer),
        consumer_(consumer),
        artifact_(artifact),
        heldout_(heldout),
        progress_(progress),
        evaluations_(evaluations),
        raw_f16_(static_cast<double>(consumer.config().KvBytesPerToken(2))) {}

  // At `options` with the measurer's artifact, or with `artifact` where given.
  absl::StatusOr<FrontierPoint> Measure(const TransferOptions& options,
                                        const Artifact* artifact = nullptr) {
    const Artifact* a = artifact != nullptr ? artifact : &artifact_;
    SCD_ASSIGN_OR_RETURN(TransferPath path, TransferPath::Create(TransferMode::kScd, producer_,
                                                                 consumer_, a, options));
    double encode = 0, rebuild = 0;
    int64_t tokens = 0;
    auto build = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
      SCD_ASSIGN_OR_RETURN(TransferStats stats, path.Run(heldout_.Prefix(w), cache));
      *bytes = stats.payload_bytes;
      encode += stats.encode_seconds;
      rebuild += stats.decode_seconds;
      tokens += stats.tokens;
      return absl::OkStatus();
    };
    SCD_ASSIGN_OR_RETURN(FidelityMetrics m, heldout_.Evaluate(build, /*greedy=*/false));
    SCD_ASSIGN_OR_RETURN(TransferPlan plan,
                         TransferPlan::Make(TransferMode::kScd, producer_.config(), a, options));
    FrontierPoint p;
    p.code_dtype = options.code_dtype;
    p.rank_k = plan.rank_k;
    p.rank_v = plan.rank_v;
    p.rank_h = plan.rank_h;
    p.kl = m.kl;
    p.bytes_per_token = m.bytes_per_token;
    p.payload_ratio = m.bytes_per_token / raw_f16_;
    const double per_token = tokens > 0 ? 1e6 / static_cast<double>(tokens) : 0;
    p.encode_us_per_token = encode * per_token;
    p.rebuild_us_per_token = rebuild * per_token;
    ++*evaluations_;
    progress_->Advance();
    progress_->SetDetail(absl::StrFormat("%s: KL %.4f at %.1f%%", WireDtypeName(p.code_dtype), p.kl,
                                         100 * p.payload_ratio));
    return p;
  }
  double raw_f16() const { return raw_f16_; }

 private:
  const LlamaModel& producer_;
  const LlamaModel& consumer_;
  const Artifact& artifact_;
  const FidelityEvaluator& heldout_;
  Progress* progress_;
  int* evaluations_;
  double raw_f16_;
};

TransferOptions SlotAt(const Artifact& artifact, const Slot& slot, int64_t rank) {
  TransferOptions o;
  const size_t layers = artifact.layers.size();
  o.layer_rank_k.assign(layers, 0);
  o.layer_rank_v.assign(layers, 0);
  o.layer_rank_h.assign(layers, 0);
  (slot.kind == CodeKind::kKey     ? o.layer_rank_k
   : slot.kind == CodeKind::kValue ? o.layer_rank_v
                                   : o.layer_rank_h)[slot.layer] = rank;
  return o;
}

// Measured points sorted by bytes, each kept only when its KL is below every cheaper point's.
std::vector<FrontierPoint> ParetoFront(std::vector<FrontierPoint> points) {
  std::sort(points.begin(), points.end(), [](const FrontierPoint& a, const FrontierPoint& b) {
    return a.bytes_per_token != b.bytes_per_token ? a.bytes_per_token < b.bytes_per_token
                                                  : a.kl < b.kl;
  });
  std::vector<FrontierPoint> front;
  for (FrontierPoint& p : points) {
    if (!front.empty() && p.bytes_per_token == front.back().bytes_per_token) continue;
    if (front.empty() || p.kl < front.back().kl) {
      front.push_back(std::move(p));
    }
  }
  // A later point with lower KL may make an earlier one pointless only when it is also cheaper,
  // which the sort excludes: `front` is ascending in bytes and strictly falling in KL.
  return front;
}

// The frontier from the measured points: the Pareto front, the fitted configuration (every code
// at full rank, f16) as the top point, even where a cheaper point measured a hair better on these
// windows — a byte budget of what scd sent before frontiers existed then always finds that very
// configuration; nothing costs more than it (int8 codes of rank 1-2 can: their per-row scales
// outweigh the halved elements) — and the recommended point.
Frontier Assemble(const std::vector<FrontierPoint>& measured, const FrontierPoint& full,
                  const FrontierFitOptions& options, double raw_f16) {
  Frontier frontier;
  frontier.raw_f16_bytes_per_token = raw_f16;
  frontier.points = ParetoFront(measured);
  if (std::count(options.dtypes.begin(), options.dtypes.end(), WireDtype::kF16) > 0) {
    while (!frontier.points.empty() &&
           frontier.points.back().bytes_per_token >= full.bytes_per_token) {
      frontier.points.pop_back();
    }
    frontier.points.push_back(full);
    frontier.points.back().predicted_kl = full.kl;
  }
  for (size_t i = 0; i < frontier.points.size(); ++i) {
    if (frontier.points[i].kl <= options.recommend_kl_ratio * full.kl) {
      frontier.recommended = static_cast<int>(i);
      break;
    }
  }
  if (frontier.recommended < 0) frontier.recommended = static_cast<int>(frontier.points.size()) - 1;
  return frontier;
}

// One reuse code of per-head maps whose column order across heads the fit chooses.
struct HeadCode {
  int layer = 0;
  CodeKind kind = CodeKind::kKey;
  std::vector<int64_t> ladder;            // one head's ranks, descending
  std::vector<std::vector<double>> loss;  // per head: KL increase at each rung, non-falling
};

ReuseTranslator* CodeMap(Artifact* artifact, int layer, CodeKind kind) {
  ArtifactLayer& a = artifact->layers[static_cast<size_t>(layer)];
  return kind == CodeKind::kKey ? &a.key : &a.value;
}

// A folded order in which head `h` keeps its first `keep` of `rank` columns and its others come
// last: a code of heads * rank - (rank - keep) columns then lowers head h alone.
std::vector<int> OrderDropping(int64_t heads, int64_t rank, int h, int64_t keep) {
  std::vector<int> order;
  for (int64_t j = 0; j < rank; ++j) {
    for (int g = 0; g < heads; ++g) {
      if (g != h || j < keep) order.push_back(g);
    }
  }
  order.insert(order.end(), static_cast<size_t>(rank - keep), h);
  return order;
}

}  // namespace

std::vector<int64_t> RankLadder(int64_t full, int steps) {
  std::vector<int64_t> ladder{full};
  const double fractions[] = {0.75, 0.5, 0.25, 0.125, 0.0625, 0.03125};
  for (double f : fractions) {
    if (static_cast<int>(ladder.size()) >= steps) break;
    const int64_t r = std::max<int64_t>(1, std::llround(static_cast<double>(full) * f));
    if (r < ladder.back()) ladder.push_back(r);
  }
  return ladder;
}

std::vector<int> GreedyHeadOrder(const std::vector<int64_t>& ladder,
                                 const std::vector<std::vector<double>>& loss) {
  const size_t heads = loss.size();
  std::vector<size_t> rung(heads, 0);
  std::vector<std::pair<size_t, size_t>> removed;  // (head, rung left), cheapest first
  for (;;) {
    size_t best = heads;
    double best_cost = std::numeric_limits<double>::infinity();
    for (size_t h = 0; h < heads; ++h) {
      const size_t i = rung[h];
      if (i + 1 >= ladder.size()) continue;
      const double cost =
          (loss[h][i + 1] - loss[h][i]) / static_cast<double>(ladder[i] - ladder[i + 1]);
      // Ties (equal measured losses) go to the head with more columns left: balanced.
      if (cost < best_cost ||
          (cost == best_cost && best < heads && ladder[i] > ladder[rung[best]])) {
        best_cost = cost;
        best = h;
      }
    }
    if (best == heads) break;
    removed.emplace_back(best, rung[best]++);
  }
  // Most important first: the columns no rung removes, head by head, then the removed rungs in
  // the reverse of their removal (a head's later rung holds its earlier columns).
  std::vector<int> order;
  for (int64_t j = 0; j < ladder.back(); ++j) {
    for (size_t h = 0; h < heads; ++h) order.push_back(static_cast<int>(h));
  }
  for (auto it = removed.rbegin(); it != removed.rend(); ++it) {
    const auto [h, i] = *it;
    order.insert(order.end(), static_cast<size_t>(ladder[i] - ladder[i + 1]), static_cast<int>(h));
  }
  return order;
}

absl::Status FoldHeadRanks(const LlamaModel& producer, const LlamaModel& consumer,
                           Artifact* artifact, const FidelityEvaluator& heldout,
                           const FrontierFitOptions& options, FrontierFitTrace* trace) {
  const int64_t heads = artifact->producer.kv_heads;
  std::vector<HeadCode> codes;
  for (int l = 0; l < static_cast<int>(artifact->layers.size()); ++l) {
    if (artifact->layers[l].route != LayerRoute::kReuse) continue;
    for (CodeKind kind : {CodeKind::kKey, CodeKind::kValue}) {
      const ReuseTranslator& t = *CodeMap(artifact, l, kind);
      if (heads < 2 || t.maps() != heads || t.folded()) continue;
      HeadCode code{l, kind, RankLadder(t.rank(), options.ladder_steps), {}};
      if (code.ladder.size() > 1) codes.push_back(std::move(code));
    }
  }
  if (codes.empty()) return absl::OkStatus();
  Stopwatch clock;
  int64_t total = 1;
  for (const HeadCode& c : codes) total += heads * static_cast<int64_t>(c.ladder.size() - 1);
  Progress progress("head ranks", total, options.progress);
  int evaluations = 0;
  PointMeasurer measure(producer, consumer, *artifact, heldout, &progress, &evaluations);
  SCD_ASSIGN_OR_RETURN(FrontierPoint full, measure.Measure(TransferOptions()));
  // Each head of each code alone down its ladder, every other code at full rank.
  for (HeadCode& code : codes) {
    const ReuseTranslator per_head = *CodeMap(artifact, code.layer, code.kind);
    const int64_t rank = per_head.rank();
    for (int h = 0; h < heads; ++h) {
      std::vector<double> loss{0.0};
      for (size_t i = 1; i < code.ladder.size(); ++i) {
        Artifact lowered = *artifact;
        SCD_ASSIGN_OR_RETURN(
            *CodeMap(&lowered, code.layer, code.kind),
            ReuseTranslator::FoldHeads(per_head, OrderDropping(heads, rank, h, code.ladder[i])));
        TransferOptions o;
        auto& ranks = code.kind == CodeKind::kKey ? o.layer_rank_k : o.layer_rank_v;
        ranks.assign(artifact->layers.size(), 0);
        ranks[static_cast<size_t>(code.layer)] = heads * rank - (rank - code.ladder[i]);
        SCD_ASSIGN_OR_RETURN(FrontierPoint p, measure.Measure(o, &lowered));
        loss.push_back(std::max(loss.back(), p.kl - full.kl));
      }
      code.loss.push_back(std::move(loss));
    }
  }
  for (const HeadCode& code : codes) {
    ReuseTranslator* t = CodeMap(artifact, code.layer, code.kind);
    SCD_ASSIGN_OR_RETURN(*t,
                         ReuseTranslator::FoldHeads(*t, GreedyHeadOrder(code.ladder, code.loss)));
  }
  progress.Done();
  if (trace != nullptr) {
    trace->head_evaluations = evaluations;
    trace->head_seconds = clock.Seconds();
    trace->folded_codes = static_cast<int>(codes.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<Frontier> FitFrontier(const LlamaModel& producer, const LlamaModel& consumer,
                                     const Artifact& artifact, const FidelityEvaluator& heldout,
                                     const FrontierFitOptions& options, FrontierFitTrace* trace) {
  if (options.dtypes.empty() || options.points_per_dtype < 1 || options.ladder_steps < 1) {
    return absl::InvalidArgumentError("a frontier needs precisions, points and ladder rungs");
  }
  Stopwatch clock;
  std::vector<Slot> slots = Slots(artifact, options.ladder_steps);
  int64_t rungs = 0;
  for (const Slot& s : slots) rungs += static_cast<int64_t>(s.ladder.size()) - 1;
  // The full ranks at each precision, each slot's lower rungs, the rest of each path's points.
  const int64_t total =
      static_cast<int64_t>(options.dtypes.size()) * options.points_per_dtype + rungs +
      (std::count(options.dtypes.begin(), options.dtypes.end(), WireDtype::kF16) ? 0 : 1);
  Progress progress("frontier", total, options.progress);
  FrontierFitTrace local;
  FrontierFitTrace& t = trace != nullptr ? *trace : local;
  t = FrontierFitTrace();
  PointMeasurer measure(producer, consumer, artifact, heldout, &progress, &t.evaluations);

  // 1. Sensitivities at f16: the full ranks, then each slot alone down its ladder.
  SCD_ASSIGN_OR_RETURN(FrontierPoint full, measure.Measure(TransferOptions()));
  t.full_kl = full.kl;
  for (Slot& slot : slots) {
    slot.loss.assign(1, 0.0);
    for (size_t i = 1; i < slot.ladder.size(); ++i) {
      SCD_ASSIGN_OR_RETURN(FrontierPoint p,
                           measure.Measure(SlotAt(artifact, slot, slot.ladder[i])));
      slot.loss.push_back(std::max(slot.loss.back(), p.kl - full.kl));
    }
  }
  // 2 and 3. Per precision: its full-rank KL, the greedy path, points spread along it measured.
  for (WireDtype dtype : options.dtypes) {
    TransferOptions at_full;
    at_full.code_dtype = dtype;
    FrontierPoint start = full;
    if (dtype != WireDtype::kF16) {
      SCD_ASSIGN_OR_RETURN(start, measure.Measure(at_full));
    }
    const std::vector<AllocatedPoint> path =
        GreedyPath(artifact, slots, start.kl, ElementBytes(dtype));
    for (size_t i : Spread(path, options.points_per_dtype)) {
      FrontierPoint p;
      if (i == 0) {
        p = start;
      } else {
        FrontierPoint want;
        want.code_dtype = dtype;
        want.rank_k = path[i].rank_k;
        want.rank_v = path[i].rank_v;
        want.rank_h = path[i].rank_h;
        SCD_ASSIGN_OR_RETURN(p, measure.Measure(TransferOptions::AtPoint(want)));
      }
      p.predicted_kl = path[i].predicted_kl;
      t.measured.push_back(p);
    }
  }
  progress.Done();

  Frontier frontier = Assemble(t.measured, full, options, measure.raw_f16());
  t.seconds = clock.Seconds();
  return frontier;
}

absl::Status FitFrontierInto(const LlamaModel& producer, const LlamaModel& consumer,
                             Artifact* artifact, const FidelityEvaluator& heldout,
                             const FrontierFitOptions& options, FrontierFitTrace* trace) {
  FrontierFitTrace local;
  FrontierFitTrace& t = trace != nullptr ? *trace : local;
  FrontierFitTrace heads;
  if (options.head_ranks) {
    SCD_RETURN_IF_ERROR(FoldHeadRanks(producer, consumer, artifact, heldout, options, &heads));
  }
  SCD_ASSIGN_OR_RETURN(artifact->frontier,
                       FitFrontier(producer, consumer, *artifact, heldout, options, &t));
  t.folded_codes = heads.folded_codes;
  t.head_evaluations = heads.head_evaluations;
  t.head_seconds = heads.head_seconds;
  return absl::OkStatus();
}

std::string FormatFrontier(const Frontier& frontier) {
  std::string out =
      absl::StrFormat("%3s %-5s %9s %8s %9s %9s %9s %9s  %s\n", "#", "codes", "KL", "pred KL",
                      "bytes/tok", "vs f16", "enc us/t", "reb us/t", "ranks");
  for (size_t i = 0; i < frontier.points.size(); ++i) {
    const FrontierPoint& p = frontier.points[i];
    absl::StrAppendFormat(&out, "%2d%s %-5s %9.4f %8.4f %9.1f %8.2f%% %9.1f %9.1f  %s\n", i,
                          static_cast<int>(i) == frontier.recommended ? "*" : " ",
                          WireDtypeName(p.code_dtype), p.kl, p.predicted_kl, p.bytes_per_token,
                          100 * p.payload_ratio, p.encode_us_per_token, p.rebuild_us_per_token,
                          p.Describe());
  }
  absl::StrAppendFormat(&out, "(* recommended; raw f16 KV = %.0f bytes/token; %s)\n",
                        frontier.raw_f16_bytes_per_token, frontier.heldout);
  return out;
}

}  // namespace scd
