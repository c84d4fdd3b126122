#include "bench/serve_benchmark.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/grpc_tls.h"
#include "bench/timings_json.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd::bench {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

std::string CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code < 17) return kNames[code];
  return absl::StrCat("CODE_", code);
}

// Runs one request; fills one StreamRecord per target (in `targets` order).
std::vector<StreamRecord> RunOne(const ServeBenchOptions& options, const BenchPrompt& prompt,
                                 absl::Time sent, int index) {
  v1::GenerateRequest request;
  if (prompt.ids.empty()) {
    request.set_prompt(prompt.text);
  } else {
    for (int32_t id : prompt.ids) request.add_prompt_ids(id);
  }
  for (const std::string& target : options.targets) request.add_targets(target);
  SetRequestModeName(prompt.mode.value_or(options.mode), &request);
  // Several salts (tenants): request i takes the (i mod n)-th.
  const std::vector<std::string> salts = absl::StrSplit(options.cache_salt, ',');
  request.set_cache_salt(
      prompt.cache_salt.value_or(salts[static_cast<size_t>(index) % salts.size()]));
  request.set_max_tokens(
      static_cast<uint32_t>(prompt.output_len > 0 ? prompt.output_len : options.output_len));
  request.set_ttft_slo_ms(options.ttft_slo_ms);
  std::map<std::string, StreamRecord> by_target;
  std::map<std::string, absl::Time> last_token;
  for (const std::string& target : options.targets) by_target[target].target = target;
  const absl::Status status =
      StreamGenerate(options.server, request, options.timeout, [&](const v1::GenerateEvent& e) {
        const absl::Time now = absl::Now();
        // A consumer called directly tags events with its own name; one target: that one.
        const std::string& key = options.targets.size() == 1 ? options.targets[0] : e.target();
        StreamRecord& r = by_target[key];
        r.target = key;
        if (e.has_token() && e.token().ids_size() > 0) {
          if (r.output_tokens == 0) {
            r.ttft_s = Seconds(now - sent);
          } else {
            r.itl_s.push_back(Seconds(now - last_token[key]));
          }
          last_token[key] = now;
          r.output_tokens += e.token().ids_size();
        } else if (e.has_finished()) {
          r.ok = true;
          r.finished = e.finished();
          r.prompt_tokens = e.finished().prompt_tokens();
          r.e2el_s = Seconds(now - sent);
        } else if (e.has_error()) {
          r.ok = false;
          r.code = e.error().code();
          r.error = e.error().message();
          r.e2el_s = Seconds(now - sent);
        }
      });
  std::vector<StreamRecord> out;
  for (const std::string& target : options.targets) {
    StreamRecord& r = by_target[target];
    if (!status.ok() && !r.ok && r.code == 0) {
      r.code = static_cast<int>(status.code());
      r.error = std::string(status.message());
      r.e2el_s = Seconds(absl::Now() - sent);
    } else if (!r.ok && r.code == 0) {
      r.code = static_cast<int>(absl::StatusCode::kInternal);
      r.error = "the stream ended without a terminal event";
    }
    out.push_back(std::move(r));
  }
  return out;
}

NodeStatsDelta Delta(const std::string& address, const v1::NodeStats& before,
                     const v1::NodeStats& after) {
  auto d = [](uint64_t a, uint64_t b) { return static_cast<int64_t>(a) - static_cast<int64_t>(b); };
  NodeStatsDelta n;
  n.address = address;
  n.role = after.role();
  n.prefills = d(after.prefills(), before.prefills());
  n.prefill_tokens = d(after.prefill_tokens(), before.prefill_tokens());
  const v1::PrefixCacheStats &a = after.prefix_cache(), &b = before.prefix_cache();
  n.cache_hits = d(a.hits(), b.hits());
  n.cache_misses = d(a.misses(), b.misses());
  n.cache_hit_tokens = d(a.hit_tokens(), b.hit_tokens());
  n.cache_evictions = d(a.evictions(), b.evictions());
  n.code_hit_tokens = d(a.code_hit_tokens(), b.code_hit_tokens());
  n.cache_entries = static_cast<int64_t>(a.entries());
  n.cache_bytes = static_cast<int64_t>(a.bytes());
  n.local_itl_us_per_token = after.local_itl_us_per_token();
  n.rebuild_itl_us_per_token = after.rebuild_itl_us_per_token();
  n.busy_prefill_us_per_token = after.busy_prefill_us_per_token();
  return n;
}

}  // namespace

absl::StatusOr<v1::NodeStats> ReadNodeStats(const std::string& address, const std::string& secret) {
  auto channel = NewGrpcChannel(address);
  v1::NodeStats stats;
  grpc::Status status;
  for (int service = 0; service < 3; ++service) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.AddMetadata("x-scd-cluster-secret", secret);
    if (service == 0) {
      status = v1::Producer::NewStub(channel)->Stats(&context, v1::StatsRequest(), &stats);
    } else if (service == 1) {
      status = v1::Consumer::NewStub(channel)->Stats(&context, v1::StatsRequest(), &stats);
    } else {
      status = v1::Registry::NewStub(channel)->Stats(&context, v1::StatsRequest(), &stats);
    }
    if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED) break;
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("Stats at ", address, ": ", status.error_message()));
  }
  return stats;
}

// Linear interpolation between closest ranks (numpy's default), as vLLM reports.
double Percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

MetricSummary Summarize(std::vector<double> values_s, const std::vector<double>& percentiles) {
  MetricSummary s;
  s.count = static_cast<int64_t>(values_s.size());
  if (values_s.empty()) return s;
  for (double& v : values_s) v *= 1e3;
  std::sort(values_s.begin(), values_s.end());
  const double n = static_cast<double>(values_s.size());
  s.mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
  double sq = 0;
  for (double v : values_s) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / n);
  s.median = Percentile(values_s, 50);
  for (double p : percentiles) s.percentiles[p] = Percentile(values_s, p);
  return s;
}

std::vector<BenchPrompt> RandomPrompts(int num_prompts, int input_len, int shared_prefix_len,
                                       int vocab_size, uint64_t seed, uint64_t prefix_seed,
                                       int first_id) {
  std::uniform_int_distribution<int32_t> id(first_id, std::max(first_id, vocab_size - 1));
  std::mt19937_64 prefix_rng(prefix_seed);
  std::vector<int32_t> prefix(static_cast<size_t>(std::max(0, shared_prefix_len)));
  for (int32_t& t : prefix) t = id(prefix_rng);
  std::mt19937_64 rng(seed);
  std::vector<BenchPrompt> prompts(static_cast<size_t>(std::max(0, num_prompts)));
  for (BenchPrompt& p : prompts) {
    p.ids = prefix;
    while (static_cast<int>(p.ids.size()) < input_len) p.ids.push_back(id(rng));
  }
  return prompts;
}

absl::StatusOr<std::vector<BenchPrompt>> PromptsFromFile(const std::string& path, int num_prompts,
                                                         int words) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot read ", path));
  std::vector<std::string> lines;
  if (words > 0) {
    std::vector<std::string> all;
    for (std::string word; in >> word;) all.push_back(word);
    for (size_t at = 0; at + static_cast<size_t>(words) <= all.size(); at += words) {
      std::string prompt;
      for (size_t i = at; i < at + static_cast<size_t>(words); ++i) {
        absl::StrAppend(&prompt, i > at ? " " : "", all[i]);
      }
      lines.push_back(std::move(prompt));
    }
  } else {
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) lines.push_back(line);
    }
  }
  if (lines.empty())
    return absl::InvalidArgumentError(absl::StrCat("--prompts: ", path, " is empty"));
  std::vector<BenchPrompt> prompts(static_cast<size_t>(std::max(0, num_prompts)));
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i].text = lines[i % lines.size()];
  return prompts;
}

absl::StatusOr<Slo> ParseGoodput(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    std::vector<std::string> kv = absl::StrSplit(item, ':');
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: '", item, "' is not NAME:MS with MS > 0 (ttft, tpot, e2el)"));
    }
    if (kv[0] == "ttft") {
      slo.ttft_ms = ms;
    } else if (kv[0] == "tpot") {
      slo.tpot_ms = ms;
    } else if (kv[0] == "e2el") {
      slo.e2el_ms = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: unknown metric '", kv[0], "' (ttft, tpot, e2el)"));
    }
  }
  return slo;
}

absl::StatusOr<ServeBenchResult> RunServeBenchmark(const ServeBenchOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("no --server");
  if (options.targets.empty()) return absl::InvalidArgumentError("no --targets");
  if (options.prompts.empty()) return absl::InvalidArgumentError("no prompts");
  if (!(options.request_rate > 0)) {
    return absl::InvalidArgumentError("--request-rate must be > 0 (inf: all at once)");
  }
  if (!(options.burstiness > 0)) return absl::InvalidArgumentError("--burstiness must be > 0");
  const int n = static_cast<int>(options.prompts.size());
  // Arrival gaps: gamma(shape = burstiness, scale = 1 / (rate * burstiness)), mean 1 / rate.
  std::vector<double> offsets(static_cast<size_t>(n), 0.0);
  if (!options.arrivals_s.empty()) {
    if (options.arrivals_s.size() != options.prompts.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a trace of ", options.arrivals_s.size(), " arrivals for ", n, " prompts"));
    }
    double last = 0;
    for (double t : options.arrivals_s) {
      if (!(t >= last) || !std::isfinite(t)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the trace's arrivals must ascend from 0: ", t, " after ", last));
      }
      last = t;
    }
    offsets = options.arrivals_s;
  } else if (std::isfinite(options.request_rate)) {
    std::mt19937_64 rng(options.seed);
    std::gamma_distribution<double> gap(options.burstiness,
                                        1.0 / (options.request_rate * options.burstiness));
    double t = 0;
    for (int i = 0; i < n; ++i) {
      offsets[static_cast<size_t>(i)] = t;
      t += gap(rng);
    }
  }

  std::vector<v1::NodeStats> before;
  for (const std::string& address : options.node_stats) {
    absl::StatusOr<v1::NodeStats> stats = ReadNodeStats(address, options.secret);
    if (!stats.ok()) return stats.status();
    before.push_back(*std::move(stats));
  }

  ServeBenchResult result;
  result.request_rate = options.request_rate;
  result.burstiness = options.burstiness;
  result.max_concurrency = options.max_concurrency;
  result.requests = n;
  result.send_s.assign(static_cast<size_t>(n), 0.0);
  std::vector<std::vector<StreamRecord>> records(static_cast<size_t>(n));
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, done = 0;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    const absl::Time due = start + absl::Seconds(offsets[static_cast<size_t>(i)]);
    absl::SleepFor(due - absl::Now());
    {
      // At most max_concurrency in flight: a request waits here past its arrival time.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock,
              [&] { return options.max_concurrency <= 0 || in_flight < options.max_concurrency; });
      ++in_flight;
    }
    const absl::Time sent = absl::Now();
    result.send_s[static_cast<size_t>(i)] = Seconds(sent - start);
    threads.emplace_back([&, i, sent] {
      records[static_cast<size_t>(i)] =
          RunOne(options, options.prompts[static_cast<size_t>(i)], sent, i);
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      ++done;
      if (options.on_progress) options.on_progress(done, n);
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  double last_end = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (int i = 0; i < n; ++i) {
    for (StreamRecord& r : records[static_cast<size_t>(i)]) {
      last_end = std::max(last_end, result.send_s[static_cast<size_t>(i)] + r.e2el_s);
      if (r.ok) {
        ++result.completed;
        result.input_tokens += r.prompt_tokens;
        result.output_tokens += r.output_tokens;
        result.producer_cached_tokens += r.finished.producer_cached_tokens();
        result.consumer_cached_tokens += r.finished.consumer_cached_tokens();
        result.payload_bytes += static_cast<int64_t>(r.finished.payload_bytes());
        if (r.output_tokens > 0) ttfts.push_back(r.ttft_s);
        if (r.output_tokens > 1) tpots.push_back(r.tpot_s());
        itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
        e2els.push_back(r.e2el_s);
        const Slo& slo = options.goodput;
        const bool good = (!slo.ttft_ms || r.ttft_s * 1e3 <= *slo.ttft_ms) &&
                          (!slo.tpot_ms || r.tpot_s() * 1e3 <= *slo.tpot_ms) &&
                          (!slo.e2el_ms || r.e2el_s * 1e3 <= *slo.e2el_ms);
        if (good) ++result.good;
      } else {
        ++result.failed;
        ++result.failures_by_code[CodeName(r.code)];
      }
      result.streams.push_back(std::move(r));
    }
  }
  result.duration_s = last_end;
  const double d = result.duration_s > 0 ? result.duration_s : 1;
  result.request_throughput = static_cast<double>(result.completed) / d;
  result.output_throughput = static_cast<double>(result.output_tokens) / d;
  result.total_token_throughput =
      static_cast<double>(result.input_tokens + result.output_tokens) / d;
  result.goodput = static_cast<double>(result.good) / d;
  result.ttft = Summarize(ttfts, options.percentiles);
  result.tpot = Summarize(tpots, options.percentiles);
  result.itl = Summarize(itls, options.percentiles);
  result.e2el = Summarize(e2els, options.percentiles);
  for (size_t i = 0; i < options.node_stats.size(); ++i) {
    // After the run a node that stopped answering is reported, not fatal: the streams stand.
    absl::StatusOr<v1::NodeStats> after = ReadNodeStats(options.node_stats[i], options.secret);
    NodeStatsDelta n = Delta(options.node_stats[i], before[i], after.ok() ? *after : before[i]);
    if (!after.ok()) n.role = absl::StrCat("unreadable: ", after.status().message());
    result.nodes.push_back(std::move(n));
  }
  return result;
}

namespace {

nlohmann::json SummaryJson(const MetricSummary& s) {
  nlohmann::json j = {
      {"mean_ms", s.mean}, {"median_ms", s.median}, {"std_ms", s.std}, {"count", s.count}};
  for (const auto& [p, v] : s.percentiles) j[absl::StrFormat("p%g_ms", p)] = v;
  return j;
}

}  // namespace

std::string ServeBenchJson(const ServeBenchResult& r, const ServeBenchOptions& options) {
  nlohmann::json j;
  j["server"] = options.server;
  j["targets"] = options.targets;
  j["mode"] = options.mode.empty() ? "auto" : options.mode;
  j["request_rate"] =
      std::isfinite(r.request_rate) ? nlohmann::json(r.request_rate) : nlohmann::json("inf");
  j["burstiness"] = r.burstiness;
  j["max_concurrency"] = r.max_concurrency;
  j["output_len"] = options.output_len;
  j["duration_s"] = r.duration_s;
  j["requests"] = r.requests;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["failures_by_code"] = r.failures_by_code;
  j["input_tokens"] = r.input_tokens;
  j["output_tokens"] = r.output_tokens;
  j["request_throughput"] = r.request_throughput;
  j["output_throughput"] = r.output_throughput;
  j["total_token_throughput"] = r.total_token_throughput;
  nlohmann::json slo = nlohmann::json::object();
  if (options.goodput.ttft_ms) slo["ttft_ms"] = *options.goodput.ttft_ms;
  if (options.goodput.tpot_ms) slo["tpot_ms"] = *options.goodput.tpot_ms;
  if (options.goodput.e2el_ms) slo["e2el_ms"] = *options.goodput.e2el_ms;
  j["goodput_slo"] = slo;
  j["cache_salt"] = options.cache_salt;
  j["ttft_slo_ms"] = options.ttft_slo_ms;
  j["producer_cached_tokens"] = r.producer_cached_tokens;
  j["consumer_cached_tokens"] = r.consumer_cached_tokens;
  j["payload_bytes"] = r.payload_bytes;
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeStatsDelta& n : r.nodes) {
    nodes.push_back({{"address", n.address},
                     {"role", n.role},
                     {"prefills", n.prefills},
                     {"prefill_tokens", n.prefill_tokens},
                     {"cache_hits", n.cache_hits},
                     {"cache_misses", n.cache_misses},
                     {"cache_hit_tokens", n.cache_hit_tokens},
                     {"cache_evictions", n.cache_evictions},
                     {"cache_entries", n.cache_entries},
                     {"cache_bytes", n.cache_bytes},
                     {"code_hit_tokens", n.code_hit_tokens},
                     {"local_itl_us_per_token", n.local_itl_us_per_token},
                     {"rebuild_itl_us_per_token", n.rebuild_itl_us_per_token},
                     {"busy_prefill_us_per_token", n.busy_prefill_us_per_token}});
  }
  j["nodes"] = nodes;
  j["good"] = r.good;
  j["goodput"] = r.goodput;
  j["ttft"] = SummaryJson(r.ttft);
  j["tpot"] = SummaryJson(r.tpot);
  j["itl"] = SummaryJson(r.itl);
  j["e2el"] = SummaryJson(r.e2el);
  // Per stream, in request order (several targets: one entry each).
  nlohmann::json targets = nlohmann::json::array(), ok = nlohmann::json::array(),
                 codes = nlohmann::json::array(), errors = nlohmann::json::array(),
                 input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                 ttfts = nlohmann::json::array(), itls = nlohmann::json::array(),
                 e2els = nlohmann::json::array(), modes = nlohmann::json::array(),
                 payload = nlohmann::json::array(), server_ttft = nlohmann::json::array(),
                 server_output = nlohmann::json::array(), producer_cached = nlohmann::json::array(),
                 consumer_cached = nlohmann::json::array(), timings = nlohmann::json::array(),
                 reasons = nlohmann::json::array(), predicted = nlohmann::json::array();
  for (const StreamRecord& s : r.streams) {
    targets.push_back(s.target);
    ok.push_back(s.ok);
    codes.push_back(CodeName(s.code));
    errors.push_back(s.error);
    input_lens.push_back(s.prompt_tokens);
    output_lens.push_back(s.output_tokens);
    ttfts.push_back(s.ttft_s * 1e3);
    itls.push_back(s.itl_s);
    e2els.push_back(s.e2el_s * 1e3);
    modes.push_back(RanModeName(s.finished));
    payload.push_back(s.finished.payload_bytes());
    server_ttft.push_back(static_cast<double>(s.finished.timings().ttft()) / 1e3);
    server_output.push_back(s.finished.output_tokens());
    producer_cached.push_back(s.finished.producer_cached_tokens());
    consumer_cached.push_back(s.finished.consumer_cached_tokens());
    timings.push_back(TimingsJson(s.finished.timings()));
    reasons.push_back(s.finished.mode_reason());
    predicted.push_back(static_cast<double>(s.finished.predicted_ttft_us()) / 1e3);
  }
  j["per_stream"] = {{"target", targets},
                     {"ok", ok},
                     {"code", codes},
                     {"error", errors},
                     {"input_len", input_lens},
                     {"output_len", output_lens},
                     {"ttft_ms", ttfts},
                     {"itl_s", itls},
                     {"e2el_ms", e2els},
                     {"mode", modes},
                     {"payload_bytes", payload},
                     {"server_ttft_ms", server_ttft},
                     {"server_output_tokens", server_output},
                     {"producer_cached_tokens", producer_cached},
                     {"consumer_cached_tokens", consumer_cached},
                     {"server_timings_ms", timings},
                     {"mode_reason", reasons},
                     {"predicted_ttft_ms", predicted}};
  j["send_s"] = r.send_s;
  return j.dump(1);
}

std::string ServeBenchTable(const ServeBenchResult& r) {
  std::string out;
  auto line = [&](const std::string& name, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-40s %14s\n", name, value));
  };
  auto num = [](double v, int digits = 2) { return absl::StrFormat("%.*f", digits, v); };
  absl::StrAppend(&out, "============ Serving Benchmark Result ============\n");
  line("Request rate (req/s):", std::isfinite(r.request_rate) ? num(r.request_rate) : "inf");
  line("Burstiness:", num(r.burstiness));
  line("Max concurrency:", r.max_concurrency > 0 ? absl::StrCat(r.max_concurrency) : "none");
  line("Successful streams:", absl::StrCat(r.completed));
  line("Failed streams:", absl::StrCat(r.failed));
  for (const auto& [code, count] : r.failures_by_code) line("  " + code + ":", absl::StrCat(count));
  line("Benchmark duration (s):", num(r.duration_s));
  line("Total input tokens:", absl::StrCat(r.input_tokens));
  line("Total generated tokens:", absl::StrCat(r.output_tokens));
  line("Request throughput (req/s):", num(r.request_throughput));
  line("Output token throughput (tok/s):", num(r.output_throughput));
  line("Total token throughput (tok/s):", num(r.total_token_throughput));
  line("Goodput (req/s):", num(r.goodput));
  auto metric = [&](const char* title, const char* name, const MetricSummary& s) {
    absl::StrAppend(&out,
                    absl::StrFormat("%s\n", absl::StrCat("---------- ", title, " ----------")));
    line(absl::StrCat("Mean ", name, " (ms):"), num(s.mean));
    line(absl::StrCat("Median ", name, " (ms):"), num(s.median));
    line(absl::StrCat("Std ", name, " (ms):"), num(s.std));
    for (const auto& [p, v] : s.percentiles) {
      line(absl::StrFormat("P%g %s (ms):", p, name), num(v));
    }
  };
  metric("Time to First Token", "TTFT", r.ttft);
  metric("Time per Output Token (excl. 1st token)", "TPOT", r.tpot);
  metric("Inter-token Latency", "ITL", r.itl);
  metric("End-to-end Latency", "E2EL", r.e2el);
  absl::StrAppend(&out, "---------- Prefix cache and transfer ----------\n");
  line("Prompt tokens from producer cache:", absl::StrCat(r.producer_cached_tokens));
  line("Prompt tokens from consumer cache:", absl::StrCat(r.consumer_cached_tokens));
  line("Code payload (bytes):", absl::StrCat(r.payload_bytes));
  for (const NodeStatsDelta& n : r.nodes) {
    absl::StrAppend(&out, absl::StrFormat("%s (%s)\n", n.address, n.role));
    if (n.role == "producer") {
      line("  Prefills run:", absl::StrCat(n.prefills));
      line("  Prefill tokens computed:", absl::StrCat(n.prefill_tokens));
      line("  Positions sent as kept codes:", absl::StrCat(n.code_hit_tokens));
    }
    line("  Cache hits / misses:", absl::StrCat(n.cache_hits, " / ", n.cache_misses));
    line("  Cache hit tokens:", absl::StrCat(n.cache_hit_tokens));
    line("  Cache evictions:", absl::StrCat(n.cache_evictions));
    line("  Cache entries / MiB after:",
         absl::StrFormat("%d / %.1f", n.cache_entries, static_cast<double>(n.cache_bytes) / (1 << 20)));
    if (n.role == "consumer") {
      line("  ITL per prompt token local / rebuild (us):",
           absl::StrFormat("%.0f / %.0f", n.local_itl_us_per_token, n.rebuild_itl_us_per_token));
    }
  }
  absl::StrAppend(&out, "==================================================\n");
  return out;
}

}  // namespace scd::bench
