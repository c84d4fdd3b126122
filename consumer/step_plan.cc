#include "consumer/step_plan.h"

#include <algorithm>
#include <cmath>

namespace scd::consumer {
namespace {

// Plans the rebuild pieces (step 3 of the header) within `*allowed` seconds and `*rows_left`.
void PlanPieces(const StepState& state, const StepLimits& limits, int64_t decodes,
                double* allowed, int64_t* rows_left, StepPlan* plan) {
  const int64_t layers = std::max<int64_t>(1, limits.model_layers);
  for (size_t w = 0; w < state.work.size(); ++w) {
    const PlannedWork& work = state.work[w];
    const int64_t remaining = work.rows_left;
    if (remaining <= 0) continue;
    int64_t n = remaining;
    const double per_row = state.rebuild_row_layer_s * work.layers;
    if (work.layers > 0) {
      n = std::min(n, *rows_left * layers / work.layers);
      if (decodes > 0) {
        n = std::min<int64_t>(
            n, per_row > 0 ? static_cast<int64_t>(std::max(0.0, std::floor(*allowed / per_row)))
                           : kMinPieceRows);
      }
    }
    if (plan->pieces.empty()) n = std::max(n, std::min(remaining, kMinPieceRows));  // progress
    if (n <= 0) break;
    plan->pieces.push_back({w, n});
    if (work.layers > 0) {
      *allowed -= per_row * static_cast<double>(n);
      *rows_left =
          std::max<int64_t>(0, *rows_left - (n * work.layers + layers - 1) / layers);
    }
    if (n < remaining) break;  // its next rows in a later step; the later work waits for them
  }
}

}  // namespace

void RebuildPrice::Observe(double seconds, int64_t rows, int layers) {
  if (layers <= 0 || rows <= 0) return;
  cost_.Add(seconds, static_cast<double>(rows) * layers);
}

StepPlan PlanStep(const StepState& state, const StepPacer& pacer, const StepLimits& limits) {
  StepPlan plan;
  std::vector<bool> leaving(state.sequences.size(), false);
  for (size_t i = 0; i < state.sequences.size(); ++i) {
    const PlannedSequence& seq = state.sequences[i];
    if (seq.cancelled) {
      plan.leaves.push_back({i, StepLeave::kCancelled});
    } else if (state.now > seq.deadline) {
      plan.leaves.push_back({i, StepLeave::kDeadline});
    } else {
      continue;
    }
    leaving[i] = true;
  }
  for (size_t i = 0; i < state.sequences.size(); ++i) {
    if (leaving[i] || !state.sequences[i].decoding) continue;
    ++plan.decodes;
    plan.batch.push_back({i, 0});
  }
  plan.allowed = pacer.Allowed(plan.decodes);
  plan.decodes_only = pacer.NeedsMeasure(plan.decodes);
  if (plan.decodes_only) return plan;  // the decodes alone, to measure them

  double allowed = plan.allowed;
  int64_t rows_left = std::max<int64_t>(0, limits.max_batched_tokens - plan.decodes);
  PlanPieces(state, limits, plan.decodes, &allowed, &rows_left, &plan);

  plan.chunk_allowed = allowed;
  plan.chunk_budget = rows_left;
  if (plan.decodes > 0) {
    plan.chunk_budget = std::min({pacer.ChunkTokens(allowed), rows_left,
                                  std::max<int64_t>(0, limits.max_skinny_rows - plan.decodes)});
  }
  int64_t chunk_left = plan.chunk_budget;
  for (size_t i = 0; i < state.sequences.size(); ++i) {
    const PlannedSequence& seq = state.sequences[i];
    if (leaving[i] || seq.decoding || seq.prompt_left <= 0) continue;
    int64_t can = chunk_left;
    if (plan.prefill_tokens == 0) can = std::max<int64_t>(can, kMinChunk);  // progress
    const int64_t n = std::min(seq.prompt_left, can);
    if (n <= 0) break;
    plan.batch.push_back({i, n});
    plan.prefill_tokens += n;
    chunk_left -= n;
  }
  return plan;
}

}  // namespace scd::consumer
