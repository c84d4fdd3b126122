// The runtime measured as an engine, cell for cell as bench/peer/peer_engine.mjs measures
// llama.cpp (bench/README.md, "Ahead of llama.cpp"): one model at one precision in one process,
//   - time to the first token of a T-token prompt (a fresh cache; prefill, the last position's
//     logits, argmax) and prefill tokens/s = T / TTFT, for each T asked;
//   - decode tokens/s with B sequences decoding together (ForwardBatch; each sequence first
//     prefilled with its own prompt, untimed; then `decode_steps` greedy steps timed after
//     `warmup_steps`), for each B asked;
//   - resident memory once the model is loaded, and at the end.
// Prompts are the same token ids the peer gets (PromptIds). Each figure is the median of
// `repeats` measurements in this process (RunEngineBench, a one-shot report); the comparison with
// llama.cpp alternates single measurements of two resident engines instead (EngineSession).
// Thread-safety: single-threaded driver (the model uses the compute threads).
#ifndef SCD_BENCH_ENGINE_BENCH_H_
#define SCD_BENCH_ENGINE_BENCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/token_id.h"
#include "model/llama_model.h"

namespace scd::bench {

struct EngineBenchOptions {
  std::vector<int64_t> prompt_lengths = {64, 1024};
  std::vector<int64_t> batch_sizes = {1, 2, 4, 8, 16};
  int64_t decode_prompt = 64;  // each decoding sequence's prompt
  int64_t decode_steps = 32;
  int64_t warmup_steps = 2;
  int repeats = 3;      // TTFT measurements per length (median)
  int long_repeats = 1;  // for prompts of 512 tokens or more
};

struct EngineCell {
  std::string kind;  // "ttft" (value: ms; rate: prompt tokens/s) or "decode" (rate: tokens/s)
  int64_t size = 0;  // prompt tokens, or sequences
  double value = 0, rate = 0;
};

struct EngineReport {
  std::vector<EngineCell> cells;
  int64_t rss_loaded = 0, rss_end = 0;  // bytes
  double load_seconds = 0;
  // {"cells": [...], "rss_loaded_bytes": ..., ...} plus `extra` fields (model, precision, cpu).
  std::string ToJson(const std::string& extra_fields) const;
};

// `batch` sequences, each prefilled with its own prompt (PromptIds, salt = its index; one
// ForwardBatch step, as the peer's context takes them), then decoding together greedily.
class DecodingBatch {
 public:
  static absl::StatusOr<std::unique_ptr<DecodingBatch>> Start(const LlamaModel& model,
                                                              int64_t batch, int64_t prompt,
                                                              int64_t capacity);
  // Runs `steps` batched steps; the seconds they took.
  absl::StatusOr<double> Steps(int64_t steps);

 private:
  explicit DecodingBatch(const LlamaModel& model) : model_(model) {}
  const LlamaModel& model_;
  std::vector<KvCache> caches_;
  std::vector<DecodeWorkspace> workspaces_;
  std::vector<TokenId> next_;
};

// One command of the interleaved comparison (bench/peer/bench_peer.py runs this runtime and
// llama.cpp side by side, each resident in its own process, and alternates their measurements at
// the grain of one command, so both meet the same machine), answered in one line:
//   "ttft T"   seconds to the first token of a T-token prompt (a fresh cache; PromptIds salt 0)
//   "batch B"  "ok" once B sequences are prefilled with their decode prompts (replacing the last)
//   "steps N"  seconds N batched decode steps of the current batch took
//   "rss"      resident bytes of this process
// bench/peer/peer_engine.mjs answers the same commands for llama.cpp.
class EngineSession {
 public:
  EngineSession(const LlamaModel& model, int64_t decode_prompt, int64_t capacity)
      : model_(model), decode_prompt_(decode_prompt), capacity_(capacity) {}
  absl::StatusOr<std::string> Handle(const std::string& line);

 private:
  const LlamaModel& model_;
  int64_t decode_prompt_, capacity_;
  std::unique_ptr<DecodingBatch> batch_;
};

// Seconds to the first token of `ids` (a fresh cache; prefill, last logits, argmax).
absl::StatusOr<double> TimeToFirstToken(const LlamaModel& model, const std::vector<TokenId>& ids);

// Token ids both engines get: deterministic, spread over [3, vocab) (past <unk>, <s>, </s>).
std::vector<TokenId> PromptIds(int64_t length, int64_t vocab, int64_t salt);

// GB/s of layer 0's gate|up projection alone for one row, `reps` times (its weights stream from
// memory when they exceed the last-level cache).
double ProjectionBandwidth(const LlamaModel& model, int reps);

absl::StatusOr<EngineReport> RunEngineBench(const LlamaModel& model,
                                            const EngineBenchOptions& options);

}  // namespace scd::bench

#endif  // SCD_BENCH_ENGINE_BENCH_H_
