// `scd-bench mixed`: does a long prompt arriving beside running decodes hold them up? D streams
// decode on a target; once each has produced `warmup_tokens` and then `baseline_tokens` more (the
// baseline window), one request with a long prompt arrives (a local prefill, or codes from the
// producer rebuilt by the consumer: its mode); the decoders keep going. Measured on the client,
// per decoder token (a token's inter-token latency is the gap since that stream's previous one):
// ITL p50 in the baseline window, and ITL p50 / p99 / max of the tokens that arrived while the
// long request was being prefilled or rebuilt (from its sending to its first token). The
// decoders must outlast that window (`decode_tokens`): a run where any ended first is reported
// as such (window_covered false).
// Thread-safety: RunMixedLoad is reentrant.
#ifndef SCD_BENCH_MIXED_LOAD_H_
#define SCD_BENCH_MIXED_LOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scd/v1/inference.pb.h"

namespace scd::bench {

struct MixedLoadOptions {
  std::string server;  // coordinator or all-in-one
  std::string target;
  std::string decode_mode = "local";  // the decoders' mode
  int decoders = 8;
  int decode_prompt_len = 64;
  int decode_tokens = 400;  // max_tokens of each decoder
  int warmup_tokens = 16;
  int baseline_tokens = 48;
  std::string long_mode = "local";  // the long request's mode (local prefill, scd rebuild, ...)
  int long_prompt_len = 2048;
  int long_output_len = 4;
  int vocab_size = 32000;  // random ids in [3, vocab_size)
  uint64_t seed = 0;
  absl::Duration timeout = absl::Seconds(600);
};

struct MixedLoadResult {
  double itl_p50_baseline_ms = 0;
  double itl_p50_during_ms = 0, itl_p99_during_ms = 0, itl_max_during_ms = 0;
  int64_t baseline_gaps = 0, during_gaps = 0;  // inter-token gaps counted in each window
  double long_ttft_ms = 0;                     // the long request: sent -> first token
  double window_ms = 0;                        // the same window, as the decoders saw it
  bool window_covered = false;                 // every decoder was still decoding at its end
  v1::Finished long_finished;                  // the long request's own account
  int decoders_ok = 0;                         // decoders that ended in Finished
  std::string error;                           // the first failure, if any
  double ratio() const {
    return itl_p50_baseline_ms > 0 ? itl_p99_during_ms / itl_p50_baseline_ms : 0;
  }
};

// INVALID_ARGUMENT for bad options; otherwise the result (failures are reported in it).
absl::StatusOr<MixedLoadResult> RunMixedLoad(const MixedLoadOptions& options);

// The result as a JSON object (for --out).
std::string MixedLoadJson(const MixedLoadOptions& options, const MixedLoadResult& result);

}  // namespace scd::bench

#endif  // SCD_BENCH_MIXED_LOAD_H_
