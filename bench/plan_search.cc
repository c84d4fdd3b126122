#include "bench/plan_search.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd::bench {
namespace {

absl::Status CheckSpace(const PlanSpace& s) {
  if (s.policies.empty()) return absl::InvalidArgumentError("plan: no mode policy to search");
  std::set<std::string> seen;
  for (RequestedMode p : s.policies) {
    if (!seen.insert(RequestedModeName(p)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: the policy ", RequestedModeName(p), " twice"));
    }
    if (!(p.is_auto() || p.Is(TransferMode::kLocal) || p.Is(TransferMode::kRaw) ||
          p.Is(TransferMode::kScd))) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: the policy ", RequestedModeName(p), ": local, raw, scd or auto"));
    }
  }
  if (s.max_producers < 1 || s.max_consumers < 1) {
    return absl::InvalidArgumentError("plan: at most 1 or more producers and consumers");
  }
  if (!(s.producer_cost > 0) || !(s.consumer_cost > 0)) {
    return absl::InvalidArgumentError("plan: a node's cost > 0");
  }
  if (!(s.attainment > 0 && s.attainment <= 1)) {
    return absl::InvalidArgumentError("plan: the attainment in (0, 1]");
  }
  return absl::OkStatus();
}

// The search's state: what ran (memoized by candidate) and the two best minimal deployments.
class Search {
 public:
  Search(const PlanSpace& space, const PlanEvaluator& evaluate)
      : space_(space), evaluate_(evaluate) {}

  // The evaluation of (policy, producers, consumers), run once.
  absl::StatusOr<size_t> Run(size_t policy, int64_t producers, int64_t consumers) {
    const auto key = std::make_tuple(policy, producers, consumers);
    if (auto it = index_.find(key); it != index_.end()) return it->second;
    PlanEvaluation e;
    e.candidate = {space_.policies[policy], producers, consumers};
    SCD_ASSIGN_OR_RETURN(e.outcome, evaluate_(e.candidate));
    e.cost = static_cast<double>(producers) * space_.producer_cost +
             static_cast<double>(consumers) * space_.consumer_cost;
    e.meets = e.outcome.attainment >= space_.attainment;
    result_.evaluated.push_back(e);
    index_[key] = result_.evaluated.size() - 1;
    return result_.evaluated.size() - 1;
  }

  bool Meets(size_t i) const { return result_.evaluated[i].meets; }

  // A minimal deployment found: kept among the two best.
  void Minimal(size_t i) {
    result_.evaluated[i].minimal = true;
    const int n = static_cast<int>(i);
    const auto& all = result_.evaluated;
    if (result_.best < 0 || BetterPlan(all[i], all[static_cast<size_t>(result_.best)])) {
      result_.runner_up = result_.best;
      result_.best = n;
    } else if (result_.runner_up < 0 ||
               BetterPlan(all[i], all[static_cast<size_t>(result_.runner_up)])) {
      result_.runner_up = n;
    }
  }

  // Whether every deployment costing at least `cost` is worse than the two best found.
  bool Priced(double cost) const {
    return result_.runner_up >= 0 &&
           cost > result_.evaluated[static_cast<size_t>(result_.runner_up)].cost;
  }

  // One policy over consumer counts (the header's search).
  absl::Status Policy(size_t policy) {
    const bool needs = !space_.policies[policy].Is(TransferMode::kLocal);
    int64_t fewest = space_.max_producers;  // what the last consumer count needed, or the bound
    bool found = false;
    for (int64_t c = 1; c <= space_.max_consumers; ++c) {
      const double floor =
          static_cast<double>(c) * space_.consumer_cost + (needs ? space_.producer_cost : 0.0);
      if (Priced(floor)) break;
      if (!needs) {
        SCD_ASSIGN_OR_RETURN(const size_t i, Run(policy, 0, c));
        if (Meets(i)) {
          Minimal(i);
          break;  // more consumers only cost more
        }
        continue;
      }
      SCD_ASSIGN_OR_RETURN(const size_t top, Run(policy, fewest, c));
      if (!Meets(top)) continue;  // nor with fewer producers
      int64_t lo = 1, hi = fewest;
      size_t at = top;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        SCD_ASSIGN_OR_RETURN(const size_t i, Run(policy, mid, c));
        if (Meets(i)) {
          hi = mid;
          at = i;
        } else {
          lo = mid + 1;
        }
      }
      if (!found || hi < fewest) Minimal(at);  // else a consumer more bought nothing
      found = true;
      fewest = hi;
      if (fewest == 1) break;  // a consumer more only costs more
    }
    return absl::OkStatus();
  }

  PlanResult Take() { return std::move(result_); }

 private:
  const PlanSpace& space_;
  const PlanEvaluator& evaluate_;
  PlanResult result_;
  std::map<std::tuple<size_t, int64_t, int64_t>, size_t> index_;
};

}  // namespace

double PlanEvaluation::goodput_per_node() const {
  return nodes() > 0 ? outcome.goodput / static_cast<double>(nodes()) : 0;
}

bool BetterPlan(const PlanEvaluation& a, const PlanEvaluation& b) {
  if (a.cost != b.cost) return a.cost < b.cost;
  if (a.goodput_per_node() != b.goodput_per_node()) {
    return a.goodput_per_node() > b.goodput_per_node();
  }
  if (a.outcome.attainment != b.outcome.attainment) {
    return a.outcome.attainment > b.outcome.attainment;
  }
  return a.nodes() < b.nodes();
}

absl::StatusOr<PlanResult> SearchPlan(const PlanSpace& space, const PlanEvaluator& evaluate) {
  SCD_RETURN_IF_ERROR(CheckSpace(space));
  Search search(space, evaluate);
  for (size_t p = 0; p < space.policies.size(); ++p) SCD_RETURN_IF_ERROR(search.Policy(p));
  return search.Take();
}

}  // namespace scd::bench
