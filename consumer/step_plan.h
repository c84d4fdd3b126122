// StepPlan: what one step of the decode scheduler (consumer/decode_scheduler.h) runs, decided from
// the scheduler's state, its pacer and the time alone -- no model, no thread, no clock read -- and
// returned as a value that the scheduler's executor carries out (as vLLM's scheduler returns a
// SchedulerOutput for its executor). Tests and the cluster simulator call PlanStep directly.
//
// The policy, in order:
//   1. Leaves: a cancelled sequence, or one whose deadline is before `now`, leaves before the
//      step (told at once, not after the step's forward) and takes no part in it.
//   2. The budget beside the decodes: StepPacer::Allowed seconds, and max_batched_tokens rows
//      less one per decode. When the pacer's measure of this many decodes is missing or old, the
//      decodes run alone (decodes_only): no rebuild piece, no prompt chunk.
//   3. Rebuild pieces, oldest work first: a piece's rows are bounded by the rows left (scaled by
//      the layers it covers over the model's) and, beside decodes, by the time left at the
//      measured seconds per row and layer (16 rows while none is measured). The first piece of a
//      step has at least 16 rows (or what is left), so rebuilding never starves. A work whose
//      rows are not all planned holds back the later ones (their rows in order). A piece's time
//      is taken from the time left at that estimate, its rows from the rows left.
//   4. Prompt chunks, oldest sequence first, within the chunk budget: the rows left with no
//      decodes; beside decodes also the pacer's tokens for the time left and the rows the skinny
//      kernels take beside the decodes (max_skinny_rows less the decodes). The first chunk has at
//      least 2 tokens (or what is left of its prompt), so prompts never starve.
//   5. Every decoding sequence is in the batch, first, one token each.
// Thread-safety: PlanStep is a pure function.
#ifndef SCD_CONSUMER_STEP_PLAN_H_
#define SCD_CONSUMER_STEP_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "consumer/step_pacer.h"

namespace scd::consumer {

// A running sequence as the planner sees it.
struct PlannedSequence {
  bool decoding = false;    // past its prompt: one token a step
  int64_t prompt_left = 0;  // prompt positions still to run here (0: none; decoding or rebuilt)
  bool cancelled = false;
  absl::Time deadline = absl::InfiniteFuture();
};

// Rebuild work handed in by a transfer (DecodeScheduler::RunBetweenSteps), not yet all run.
struct PlannedWork {
  int64_t rows_left = 0;
  int layers = 0;  // the model layers each row covers (0: not counted against the budget)
};

// What the scheduler knows when it plans a step.
struct StepState {
  absl::Time now;
  std::vector<PlannedSequence> sequences;  // in the order they joined
  std::vector<PlannedWork> work;           // oldest first
  // The measured seconds a rebuild row costs per layer (RebuildPrice; 0: none measured yet).
  double rebuild_row_layer_s = 0;
};

struct StepLimits {
  int64_t max_batched_tokens = 512;
  int64_t model_layers = 1;
  int64_t max_skinny_rows = 64;  // model/skinny_gemm.h kSkinnyMaxRows
};

enum class StepLeave { kCancelled, kDeadline };

struct StepPlan {
  struct Leave {
    size_t sequence = 0;  // index into StepState::sequences
    StepLeave why = StepLeave::kCancelled;
  };
  struct Piece {
    size_t work = 0;  // index into StepState::work
    int64_t rows = 0;
  };
  struct Member {
    size_t sequence = 0;
    int64_t chunk = 0;  // prompt tokens of this step; 0: a decode
  };
  std::vector<Leave> leaves;
  int64_t decodes = 0;
  bool decodes_only = false;
  double allowed = 0;  // seconds beside the decodes, before the pieces (infinite with none)
  std::vector<Piece> pieces;
  double chunk_allowed = 0;  // seconds left for prompt chunks after the pieces' estimates
  int64_t chunk_budget = 0;  // prompt tokens the step may take after the pieces
  std::vector<Member> batch;  // decodes first, then chunks
  int64_t prefill_tokens = 0;
};

// What a rebuild row costs per layer (StepState::rebuild_row_layer_s), learnt from the pieces that
// ran: their seconds over their rows x layers as an ItlCost's decayed sums (consumer/step_pacer.h;
// an older piece 0.95 per newer one), each piece weighing by its rows. A receive also hands in
// one-row pieces -- the prompt's last token through a layer, the last logits
// (consumer/code_receiver.h) -- that cost as much as tens of code rows: averaged piece by piece,
// each priced every row after it at a quarter of its own cost, and pieces that fit a step split
// into several, a step each (the knee, bench/README.md). Weighed by their rows they add their time
// to the rows they come with.
class RebuildPrice {
 public:
  // A piece of `rows` rows over `layers` layers ran in `seconds` (layers <= 0: not priced).
  void Observe(double seconds, int64_t rows, int layers);
  // Seconds per row and layer; 0 until a piece was observed.
  double RowLayerSeconds() const { return cost_.UsPerToken() / 1e6; }

 private:
  ItlCost cost_;  // {seconds, rows x layers}
};

// Rebuild rows a step runs at least; prompt tokens a step beside decodes runs at least.
inline constexpr int64_t kMinPieceRows = 16;
inline constexpr int64_t kMinChunk = 2;

StepPlan PlanStep(const StepState& state, const StepPacer& pacer, const StepLimits& limits);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_STEP_PLAN_H_
