// The serving load benchmark behind `scd-bench serve`, after `vllm bench serve`: requests arrive
// as a Poisson process (or a gamma process with --burstiness; rate inf = all at once), at most
// `max_concurrency` in flight, each streamed from the public Inference API; every stream's TTFT,
// inter-token latencies, TPOT and end-to-end latency are measured on the client, next to the
// server's own Finished event (timings, mode, payload bytes). Summaries: mean, median, std and
// chosen percentiles of each metric, request and token throughput, goodput under SLOs, failures
// by status code; the JSON has the run's totals and per-request arrays.
// Thread-safety: RunServeBenchmark is reentrant (each call has its own clients and threads).
#ifndef SCD_BENCH_SERVE_BENCHMARK_H_
#define SCD_BENCH_SERVE_BENCHMARK_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/inference.pb.h"

namespace scd::bench {

// One prompt: text (tokenized by the server) or token ids; and, for a replayed trace, what its
// request asks over the run's defaults (ServeBenchOptions).
struct BenchPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::optional<std::string> mode;        // unset: options.mode
  int output_len = 0;                     // 0: options.output_len
  std::optional<std::string> cache_salt;  // unset: options.cache_salt's turn
};

// Prompts of random token ids, as vLLM's "random" dataset and SGLang's generated-shared-prefix
// set: `input_len` ids in all, the first `shared_prefix_len` of them common to every prompt
// (drawn with `prefix_seed`: runs with the same prefix seed share the prefix), the rest each
// prompt's own (drawn with `seed`); ids uniform in [first_id, vocab_size). An `input_len` below
// `shared_prefix_len` is taken as `shared_prefix_len`.
std::vector<BenchPrompt> RandomPrompts(int num_prompts, int input_len, int shared_prefix_len,
                                       int vocab_size, uint64_t seed, uint64_t prefix_seed,
                                       int first_id = 3);
// One prompt per non-empty line of a text file (at most `num_prompts`, cycled when the file has
// fewer). NOT_FOUND / INVALID_ARGUMENT (no prompts) otherwise.
// With `words` > 0, the file's text is instead cut into prompts of that many consecutive
// whitespace-separated words (long real prompts from a corpus), cycled likewise.
absl::StatusOr<std::vector<BenchPrompt>> PromptsFromFile(const std::string& path, int num_prompts,
                                                         int words = 0);

// SLOs for goodput: a stream counts when every given bound holds (milliseconds; unset: none).
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
};
// Parses "ttft:MS tpot:MS e2el:MS" items (any subset). INVALID_ARGUMENT naming the bad item.
absl::StatusOr<Slo> ParseGoodput(const std::vector<std::string>& items);

struct ServeBenchOptions {
  std::string server;                // coordinator or all-in-one (host:port)
  std::vector<std::string> targets;  // consumer names; several = fan-out
  std::string mode;                  // "" = auto
  std::vector<BenchPrompt> prompts;  // one request each, in order
  // GenerateRequest.cache_salt; comma-separated: request i takes the (i mod n)-th (tenants).
  std::string cache_salt;
  uint32_t ttft_slo_ms = 0;          // every request's ttft_slo_ms (auto's objective); 0: none
  int output_len = 128;              // max_tokens, with ignore-eos behaviour left to the model
  double request_rate = INFINITY;    // requests/s; inf = all at once
  // A trace: each prompt's send time, seconds after the start, ascending, one per prompt; empty:
  // drawn from request_rate and burstiness.
  std::vector<double> arrivals_s;
  double burstiness = 1.0;           // gamma shape: 1 = Poisson, < 1 burstier, > 1 steadier
  int max_concurrency = 0;           // 0 = unbounded
  uint64_t seed = 0;                 // arrival times
  absl::Duration timeout = absl::Seconds(600);  // per request
  std::vector<double> percentiles = {50, 90, 99};
  Slo goodput;
  // Nodes whose Stats (control plane: a producer's, a consumer's or a coordinator's control
  // address) are read before and after the run, and the cluster secret they check: the run's
  // prefill tokens and prefix-cache counters per node.
  std::vector<std::string> node_stats;
  std::string secret;
  // Called after each request ends (done, total): the progress bar.
  std::function<void(int, int)> on_progress;
};

// One target's stream of one request.
struct StreamRecord {
  std::string target;
  bool ok = false;                // ended in Finished
  int code = 0;                   // google.rpc code when not ok (Error event or RPC status)
  std::string error;
  int64_t prompt_tokens = 0;      // from Finished
  int64_t output_tokens = 0;      // ids counted on the client
  double ttft_s = 0;              // request sent -> first token id received
  double e2el_s = 0;              // request sent -> stream's terminal event
  std::vector<double> itl_s;      // gaps between token ids received
  v1::Finished finished;          // the server's own account (when ok)
  double tpot_s() const {
    return output_tokens > 1 ? (e2el_s - ttft_s) / static_cast<double>(output_tokens - 1) : 0;
  }
};

// What one node did during the run: its Stats after minus before (counters), and what its
// prefix cache holds after.
struct NodeStatsDelta {
  std::string address;
  std::string role;                   // "producer" | "consumer" | "coordinator"
  int64_t prefills = 0;               // producer: prefills run
  int64_t prefill_tokens = 0;         // producer: prompt positions computed
  int64_t cache_hits = 0, cache_misses = 0, cache_hit_tokens = 0, cache_evictions = 0;
  int64_t cache_entries = 0, cache_bytes = 0;  // after the run
  int64_t code_hit_tokens = 0;  // producer: positions whose codes were sent as kept
  // Consumer, after the run: ITL per prompt token of a local prefill / a rebuild (NodeStats).
  double local_itl_us_per_token = 0, rebuild_itl_us_per_token = 0;
  double busy_prefill_us_per_token = 0;  // a local prefill's time per token beside decodes
};

// Mean, median, std and the chosen percentiles of one metric (milliseconds).
struct MetricSummary {
  double mean = 0, median = 0, std = 0;
  std::map<double, double> percentiles;
  int64_t count = 0;
};

// Linear interpolation between closest ranks (numpy's default), as vLLM reports; `sorted`
// ascending.
double Percentile(std::vector<double> sorted, double p);
// `values_s` (seconds) summarised in milliseconds.
MetricSummary Summarize(std::vector<double> values_s, const std::vector<double>& percentiles);

struct ServeBenchResult {
  double request_rate = 0, burstiness = 1;
  int max_concurrency = 0;
  double duration_s = 0;        // first request sent -> last stream ended
  int64_t requests = 0;         // sent
  int64_t completed = 0;        // streams that finished
  int64_t failed = 0;           // streams that did not
  std::map<std::string, int64_t> failures_by_code;  // "RESOURCE_EXHAUSTED": n
  int64_t input_tokens = 0, output_tokens = 0;      // over completed streams
  // Over completed streams (Finished): prompt tokens served from the producer's and from the
  // consumer's prefix cache, and code payload bytes.
  int64_t producer_cached_tokens = 0, consumer_cached_tokens = 0, payload_bytes = 0;
  double request_throughput = 0;                    // completed streams / s
  double output_throughput = 0;                     // output tokens / s
  double total_token_throughput = 0;                // (input + output) tokens / s
  double goodput = 0;                               // streams meeting every SLO / s
  int64_t good = 0;
  MetricSummary ttft, tpot, itl, e2el;
  std::vector<StreamRecord> streams;  // in request order, then target order
  std::vector<double> send_s;         // per request: when it was sent, since the start
  std::vector<NodeStatsDelta> nodes;  // options.node_stats, in order
};

// A node's Stats through its control plane: a producer's, a consumer's or a coordinator's
// (whichever service answers there), with the cluster secret; the RPC's status otherwise.
absl::StatusOr<v1::NodeStats> ReadNodeStats(const std::string& address, const std::string& secret);

// Runs the load. INVALID_ARGUMENT: no server, targets or prompts, a rate <= 0, burstiness <= 0,
// arrivals not one per prompt or not ascending from 0;
// a node's Stats unreadable (before the run): its status; otherwise the result (failures are
// counted, not errors).
absl::StatusOr<ServeBenchResult> RunServeBenchmark(const ServeBenchOptions& options);

// The result as JSON (totals, summaries in ms, per-stream arrays, failures), one object.
std::string ServeBenchJson(const ServeBenchResult& result, const ServeBenchOptions& options);
// A human-readable table (vLLM's layout) for stdout.
std::string ServeBenchTable(const ServeBenchResult& result);

}  // namespace scd::bench

#endif  // SCD_BENCH_SERVE_BENCHMARK_H_
