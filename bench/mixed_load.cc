#include "bench/mixed_load.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/serve_benchmark.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

// One stream's token arrival times and how it ended.
struct Stream {
  std::vector<absl::Time> tokens;
  bool finished = false;
  std::string error;
  v1::Finished account;
};

v1::GenerateRequest Request(const MixedLoadOptions& o, const std::string& mode,
                            const BenchPrompt& prompt, int max_tokens) {
  v1::GenerateRequest request;
  request.add_targets(o.target);
  SetRequestModeName(mode, &request);
  for (int32_t id : prompt.ids) request.add_prompt_ids(id);
  request.set_max_tokens(static_cast<uint32_t>(max_tokens));
  request.set_deadline_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(o.timeout)));
  return request;
}

}  // namespace

absl::StatusOr<MixedLoadResult> RunMixedLoad(const MixedLoadOptions& o) {
  if (o.server.empty() || o.target.empty()) {
    return absl::InvalidArgumentError("give --server and --target");
  }
  if (o.decoders < 1 || o.decode_tokens <= o.warmup_tokens + o.baseline_tokens ||
      o.long_prompt_len < 1 || o.long_output_len < 1 || o.vocab_size < 4) {
    return absl::InvalidArgumentError(
        "need at least one decoder whose tokens outnumber warm-up plus baseline, a long prompt, "
        "one output token and a vocabulary of 4 ids");
  }
  const std::vector<BenchPrompt> prompts =
      RandomPrompts(o.decoders, o.decode_prompt_len, 0, o.vocab_size, o.seed, o.seed);
  const BenchPrompt long_prompt =
      RandomPrompts(1, o.long_prompt_len, 0, o.vocab_size, o.seed + 1, o.seed + 1)[0];
  absl::Mutex mu;
  std::vector<Stream> streams(static_cast<size_t>(o.decoders) + 1);  // the long one last
  auto run = [&](size_t index, const v1::GenerateRequest& request) {
    const absl::Status status =
        StreamGenerate(o.server, request, o.timeout, [&](const v1::GenerateEvent& e) {
          const absl::Time now = absl::Now();
          absl::MutexLock lock(&mu);
          Stream& s = streams[index];
          for (int i = 0; i < e.token().ids_size(); ++i) s.tokens.push_back(now);
          if (e.has_finished()) {
            s.finished = true;
            s.account = e.finished();
          }
          if (e.has_error()) s.error = e.error().message();
        });
    absl::MutexLock lock(&mu);
    if (!status.ok() && streams[index].error.empty()) {
      streams[index].error = std::string(status.message());
    }
    if (!streams[index].finished && streams[index].error.empty()) {
      streams[index].error = "the stream ended without a terminal event";
    }
  };
  std::vector<std::thread> threads;
  for (int d = 0; d < o.decoders; ++d) {
    threads.emplace_back(run, static_cast<size_t>(d),
                         Request(o, o.decode_mode, prompts[static_cast<size_t>(d)],
                                 o.decode_tokens));
  }
  // The baseline: every decoder past its warm-up and baseline tokens (or ended).
  absl::Time sent;
  {
    absl::MutexLock lock(&mu);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      for (int d = 0; d < o.decoders; ++d) {
        const Stream& s = streams[static_cast<size_t>(d)];
        if (!s.error.empty() || s.finished) continue;
        if (static_cast<int>(s.tokens.size()) < o.warmup_tokens + o.baseline_tokens) return false;
      }
      return true;
    };
    mu.Await(absl::Condition(&ready));
    sent = absl::Now();
  }
  threads.emplace_back(run, static_cast<size_t>(o.decoders),
                       Request(o, o.long_mode, long_prompt, o.long_output_len));
  for (std::thread& t : threads) t.join();

  MixedLoadResult r;
  const Stream& long_stream = streams.back();
  if (!long_stream.error.empty()) r.error = absl::StrCat("the long request: ", long_stream.error);
  r.long_finished = long_stream.account;
  const absl::Time first = long_stream.tokens.empty() ? sent : long_stream.tokens.front();
  r.long_ttft_ms = absl::ToDoubleMilliseconds(first - sent);
  r.window_ms = r.long_ttft_ms;
  r.window_covered = !long_stream.tokens.empty();
  std::vector<double> baseline, during;
  for (int d = 0; d < o.decoders; ++d) {
    const Stream& s = streams[static_cast<size_t>(d)];
    if (s.finished) ++r.decoders_ok;
    if (!s.error.empty() && r.error.empty()) r.error = absl::StrCat("decoder ", d, ": ", s.error);
    if (s.tokens.empty() || s.tokens.back() < first) r.window_covered = false;
    for (size_t i = 1; i < s.tokens.size(); ++i) {
      const double gap = absl::ToDoubleSeconds(s.tokens[i] - s.tokens[i - 1]);
      if (static_cast<int>(i) > o.warmup_tokens && s.tokens[i] < sent) baseline.push_back(gap);
      if (s.tokens[i] > sent && s.tokens[i] <= first) during.push_back(gap);
    }
  }
  const MetricSummary before = Summarize(baseline, {50});
  const MetricSummary while_long = Summarize(during, {50, 99});
  r.itl_p50_baseline_ms = before.median;
  r.itl_p50_during_ms = while_long.median;
  r.itl_p99_during_ms = while_long.percentiles.count(99) ? while_long.percentiles.at(99) : 0;
  r.itl_max_during_ms =
      during.empty() ? 0 : 1e3 * *std::max_element(during.begin(), during.end());
  r.baseline_gaps = before.count;
  r.during_gaps = while_long.count;
  return r;
}

std::string MixedLoadJson(const MixedLoadOptions& o, const MixedLoadResult& r) {
  nlohmann::json j;
  j["target"] = o.target;
  j["decoders"] = o.decoders;
  j["decode_mode"] = o.decode_mode;
  j["decode_prompt_len"] = o.decode_prompt_len;
  j["long_mode"] = o.long_mode;
  j["long_prompt_len"] = o.long_prompt_len;
  j["itl_p50_baseline_ms"] = r.itl_p50_baseline_ms;
  j["itl_p50_during_ms"] = r.itl_p50_during_ms;
  j["itl_p99_during_ms"] = r.itl_p99_during_ms;
  j["itl_max_during_ms"] = r.itl_max_during_ms;
  j["ratio_p99_during_to_p50_baseline"] = r.ratio();
  j["baseline_gaps"] = r.baseline_gaps;
  j["during_gaps"] = r.during_gaps;
  j["long_ttft_ms"] = r.long_ttft_ms;
  j["window_covered"] = r.window_covered;
  j["long_mode_used"] = RanModeName(r.long_finished);
  j["long_payload_bytes"] = r.long_finished.payload_bytes();
  j["decoders_ok"] = r.decoders_ok;
  j["error"] = r.error;
  return j.dump(1);
}

}  // namespace scd::bench
