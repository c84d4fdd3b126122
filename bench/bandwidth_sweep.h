// The bandwidth sweep behind `scd-bench sweep`: time to first token and its breakdown against
// link bandwidth for every transfer mode, next to the quality each mode keeps (the method paper's
// Figure 3 and Tables 2 and 4), against a live deployment: the coordinator's Registry.SetLinkShape
// sets the producer's link between cells, no node restarts.
//
// Per consumer: first the stages alone, in the same run, on an unshaped link (each mode's
// producer prefill, last-layer rebuild and first decode step; the consumer's own prefill); then
// for every bandwidth and mode every prompt once, recording the server's Timings, payload bytes,
// the mode used and the link. A stage "alone" is the fastest that stage was seen for the mode and
// prompt anywhere in the run (`alone_repeats` stage runs and every cell: on an unshaped link the
// last rebuild queues behind the prefill, on a slow one it shows alone). Each request's lower
// bound is
//   max(prefill alone, (payload bytes - burst) / bandwidth + latency + last rebuild alone,
//       rebuild alone) + decode step alone
// -- the max(prefill, bytes / bandwidth) + last rebuild + decode wherever the last chunk
// leaves at the prefill's end (every KV mode; there the two differ by the last rebuild, ~1 ms);
// when the last chunk is a patch layer's hidden-state code it leaves before the producer's last
// layer runs and its rebuild overlaps that layer, which the form would count twice. The
// third term (issue 28): the consumer cannot be done before it has rebuilt every layer, however
// the rebuild overlaps the transfer; where its aligners cost more than the producer's prefill
// (the hard 260K pair's: 3 patch layers of a 512-wide MLP on a 64-wide model) that is the bound.
// (local: the consumer's own prefill alone), so TTFT / bound >= 1 up to noise, and where a cell
// exceeds the bound the stage holding the excess is named. Quality (real weights only) is measured
// against the consumer's own prefill: greedy-token agreement over the first 32 tokens and the
// first token's KL divergence from the top-k logprobs.
// Thread-safety: RunBandwidthSweep is reentrant; requests run one at a time (unloaded TTFT).
#ifndef SCD_BENCH_BANDWIDTH_SWEEP_H_
#define SCD_BENCH_BANDWIDTH_SWEEP_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/serve_benchmark.h"

namespace scd::bench {

struct SweepOptions {
  std::string server;                  // public Inference API (coordinator or all-in-one)
  std::string control;                 // the coordinator's control plane (Registry.SetLinkShape)
  std::string secret;                  // the cluster secret
  std::vector<std::string> consumers;  // swept one after another
  // auto: the coordinator chooses per request (with max_kl and ttft_slo_ms below); its cells
  // record the choice and the TTFT it predicted.
  std::vector<std::string> modes = {"local", "raw", "int4", "recompute", "reuse", "scd"};
  double max_kl = 0;         // auto's quality budget (0: the recommended point's)
  uint32_t ttft_slo_ms = 0;  // auto's TTFT objective (0: none)
  // The trace judges each request's TTFT against this (0: ttft_slo_ms), without sending it.
  double judge_ttft_ms = 0;
  // The trace's steps after the first change the shaper without the coordinator planning with
  // them (SetLinkShapeRequest.unannounced): it learns the rate from completed transfers.
  bool trace_unannounced = false;
  // The trace's paired replay (adaptation against none): after auto's pass over the trace, each
  // of its requests is sent again at the same instant of the trace (the rate in force at its
  // start, then the same steps at the same offsets), as what auto chose sent as a fixed mode --
  // local, or scd at the point (max_kl = its KL: the frontier's cheapest within it is the point),
  // which never adapts. Mode "auto-kept-replay" in the records.
  bool trace_paired = false;
  std::vector<double> bandwidths_gbps = {0.01, 0.1, 1, 10, 100, INFINITY};  // inf: unshaped
  double latency_us = 0;
  std::vector<BenchPrompt> prompts;
  int max_tokens = 32;    // agreement is over min(32, max_tokens) tokens
  int logprobs = 20;      // top-k for the first token's KL
  int alone_repeats = 3;  // each stage alone: the fastest of this many runs
  // The shaper's token bucket starts full (transport/link_shaper.h, as tc tbf's burst): that
  // many bytes pass before the rate applies, so the transfer bound is (bytes - burst) / rate.
  double burst_bytes = 64 * 1024;
  bool fidelity = true;  // real weights: quality columns; dummy weights: "no fidelity"
  // How the link is shaped; several: each cell is measured over each in turn (interleaved, so
  // they see the same machine), every other link unshaped meanwhile.
  struct Link {
    std::string name;  // shaper | netns (recorded)
    // Sets it (gbps inf: unshaped); null: the coordinator's Registry.SetLinkShape (the
    // producer's shaper).
    std::function<absl::Status(double gbps, double latency_us)> set;
  };
  std::vector<Link> links = {{"shaper", nullptr}};
  // Called before each request: (done, total, what).
  std::function<void(int, int, const std::string&)> on_progress;
};

// The stages of one (consumer, mode, prompt) measured alone on an unshaped link, microseconds.
struct StagesAlone {
  double prefill_us = 0;       // producer prefill (local: the consumer's own)
  double last_rebuild_us = 0;  // last layer's rebuild after the last chunk
  double rebuild_us = 0;       // the consumer's whole rebuild (every layer)
  double decode_us = 0;        // first decode step
  // Per layer, each the fastest seen (codec/ttft_model.h's pipeline term): the producer's codes
  // out, from its pass's start, and the consumer's rebuild of that layer.
  std::vector<double> layer_codes_us, layer_rebuild_us;
};

struct SweepRecord {
  std::string consumer, mode, mode_used, mode_reason;
  // What it ran as ("local", "raw", "scd int4 K 2,2 V ..": the point's precision and ranks), and
  // auto's predicted TTFT (0: none; Finished.predicted_ttft_us).
  std::string choice;
  double predicted_ttft_us = 0;
  double bandwidth_gbps = 0;  // inf = unshaped
  double latency_us = 0;
  std::string link;  // shaper | netns
  // The producer shaper's rate the server reports for this request (Finished.link; 0 = none): the
  // cell's bandwidth over the shaper, 0 over netns, where tc shapes the veth instead.
  double shaper_gbps = 0;
  int prompt = 0;
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, output_tokens = 0;
  uint64_t payload_bytes = 0;
  v1::Timings timings;        // the server's breakdown, microseconds
  double client_ttft_us = 0;  // request sent -> first token id, on the client
  StagesAlone alone;
  double transfer_bound_us = 0;  // payload bytes / bandwidth (+ latency)
  double bound_us = 0;
  double pipeline_us = 0;    // the bound's pipeline term alone (0: no per-layer times)
  double ratio = 0;          // timings.ttft / bound
  std::string excess_stage;  // where a ratio above 1.15 is held ("" otherwise)
  // Quality against the consumer's own prefill (fidelity only; -1: not measured).
  double agreement = -1;     // share of the first min(32, n) greedy tokens equal
  double first_kl = -1;      // KL(local || mode) of the first token over local's top-k (nats)
  std::vector<int32_t> ids;  // generated ids
};

struct SweepResult {
  std::vector<SweepRecord> records;
  // Producer prefill speed measured here (prompt tokens / prefill s, unshaped), for the
  // compute-scaled axis.
  double prefill_tokens_per_s = 0;
};

// One request as the sweep sends it (auto with the options' max_kl and ttft_slo_ms), and what
// came back.
struct SweepReply {
  absl::Status status;
  bool finished = false;
  v1::Finished f;
  std::vector<int32_t> ids;
  v1::TokenLogprobs first;  // the first generated position's logprobs
  v1::Started started;
  double client_ttft_us = 0;
  std::string error;
};
// What a request ran as: "local", "raw", or "scd int4 K 2,2 V 3,3 H 0,0" (the point sent).
// auto or auto-keep (auto's choice sent at its ranks: GenerateRequest.keep_ranks).
bool IsAutoMode(const std::string& mode);
std::string ChoiceText(const v1::Started& started, const v1::Finished& finished);
// `scd_max_kl` > 0 with mode scd: the frontier's cheapest point within it.
SweepReply SendSweepRequest(const SweepOptions& o, const std::string& consumer,
                            const std::string& mode, const BenchPrompt& prompt,
                            double scd_max_kl = 0);
// Every producer's shaper at `gbps` (inf: unshaped) and one-way `latency_us` through the
// coordinator's Registry.SetLinkShape at `control` (with the cluster secret). UNAVAILABLE when a
// producer did not take it.
absl::Status SetLinkShapeAt(const std::string& control, const std::string& secret, double gbps,
                            double latency_us, bool unannounced = false);
// The same for the sweep's coordinator and latency.
absl::Status SetCoordinatorShape(const SweepOptions& o, double gbps, bool unannounced = false);

// INVALID_ARGUMENT naming the first mode that is none of local, raw, int4, recompute, reuse, scd,
// auto.
absl::Status ValidateSweepModes(const std::vector<std::string>& modes);

// INVALID_ARGUMENT: no server, control address, consumers, modes, bandwidths or prompts, an
// unknown mode, a bandwidth <= 0. Requests that fail are records with ok = false.
absl::StatusOr<SweepResult> RunBandwidthSweep(const SweepOptions& options);

// One JSON object per line, one line per request.
std::string SweepJsonl(const SweepResult& result);
// Per (consumer, mode, bandwidth): medians over the prompts, one CSV row each, with a header.
std::string SweepSummaryCsv(const SweepResult& result);
// The same cells over two links (--link shaper,netns): median TTFT of each and netns against
// shaper in percent, one CSV row per cell present in both.
std::string LinkComparisonCsv(const SweepResult& shaper, const SweepResult& netns);
// "0.01", "inf": a rate (Gbit/s, req/s) as file names and tables show it.
std::string RateText(double rate);

}  // namespace scd::bench

#endif  // SCD_BENCH_BANDWIDTH_SWEEP_H_
