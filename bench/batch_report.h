// `scd_model_bench --batch-report`: what batching decode steps buys on this machine, measured
// against its own read bandwidth in the same run, and the attention layout's choice
// (model/llama_model.h):
// - decode tokens/s of B sequences advanced by B per-sequence Forward calls (each reads every
//   weight) against one ForwardBatch of B rows (reads them once), B = 1 .. 16, after 128-token
//   contexts, on the TinyLlama-1.1B shape cut to 4 layers (dummy weights, f32) and on
//   tinystories-4m's shape; the batched step's weight reads per second against at::mv's;
// - one layer's attention for B decoding sequences whose caches hold mixed lengths: per sequence
//   against its own cache (what ForwardBatch runs) against padding the caches to the longest and
//   masking (one bmm over the batch, after copying every cache into the padded tensor).
// On a GPU (--device cuda; scripts/device_batched_check.sh) the decode tables alone, as markdown,
// for each --dtype, with the step time; every timed step ends with its greedy tokens on the host
// (ATen runs GPU work asynchronously: that copy waits for the step, as a decoding loop would).
// Also the helpers the model bench's reports share.
// Thread-safety: call from main().
#ifndef SCD_BENCH_BATCH_REPORT_H_
#define SCD_BENCH_BATCH_REPORT_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama_model.h"
#include "model/runtime.h"

namespace scd {

// The best wall time of `iterations` runs of `f` (after one warm-up run), seconds.
double BestSeconds(int iterations, const std::function<void()>& f);
double Median(std::vector<double> v);
// Bytes of weight a decode step reads (every layer's matrices and the LM head).
int64_t WeightBytes(const LlamaModel& model);
// Read bandwidth of at::mv over a 256 MiB f32 matrix, GB/s (best of 10).
double MvReadGbps();

// Where --batch-report runs and on what; the defaults give bench/README.md's CPU report.
struct BatchReportOptions {
  c10::Device device = c10::Device(c10::kCPU);
  std::vector<Precision> dtypes = {Precision{}};  // one decode table per dtype and shape
  int64_t tinyllama_layers = 4;  // TinyLlama-1.1B cut to this many layers; 0: all of them
  int64_t context = 128;         // tokens in every sequence's cache before the timed steps
};

// `configs`: ../shared/configs. Returns the process exit code.
int BatchReport(const std::string& configs, const BatchReportOptions& options = {});

}  // namespace scd

#endif  // SCD_BENCH_BATCH_REPORT_H_
