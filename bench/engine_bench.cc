#include "bench/engine_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/process_memory.h"
#include "base/status_macros.h"
#include "model/skinny_gemm.h"

namespace scd::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2]
                                      : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

TokenId Argmax(const at::Tensor& logits) {
  return static_cast<TokenId>(logits.reshape({-1}).argmax().item<int64_t>());
}


}  // namespace

absl::StatusOr<double> TimeToFirstToken(const LlamaModel& model, const std::vector<TokenId>& ids) {
  KvCache cache = model.NewCache(static_cast<int64_t>(ids.size()) + 1);
  const auto start = Clock::now();
  SCD_ASSIGN_OR_RETURN(ForwardOutput out, model.Forward(ids, &cache));
  (void)Argmax(out.logits);
  return SecondsSince(start);
}

absl::StatusOr<std::string> EngineSession::Handle(const std::string& line) {
  long long n = 0;
  char word[16] = {};
  if (line == "rss") return absl::StrCat(ResidentBytes());
  if (std::sscanf(line.c_str(), "%15s %lld", word, &n) != 2 || n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("not a command: '", line, "'"));
  }
  const std::string command = word;
  if (command == "ttft") {
    SCD_ASSIGN_OR_RETURN(double s,
                         TimeToFirstToken(model_, PromptIds(n, model_.config().vocab_size, 0)));
    return absl::StrFormat("%.6f", s);
  }
  if (command == "batch") {
    batch_.reset();  // its caches go before the next ones are made
    SCD_ASSIGN_OR_RETURN(batch_, DecodingBatch::Start(model_, n, decode_prompt_, capacity_));
    return std::string("ok");
  }
  if (command == "steps" && batch_ != nullptr) {
    SCD_ASSIGN_OR_RETURN(double s, batch_->Steps(n));
    return absl::StrFormat("%.6f", s);
  }
  return absl::InvalidArgumentError(absl::StrCat("not a command here: '", line, "'"));
}

absl::StatusOr<std::unique_ptr<DecodingBatch>> DecodingBatch::Start(const LlamaModel& model,
                                                                    int64_t batch, int64_t prompt,
                                                                    int64_t capacity) {
  std::unique_ptr<DecodingBatch> d(new DecodingBatch(model));
  std::vector<std::vector<TokenId>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    d->caches_.push_back(model.NewCache(capacity));
    d->workspaces_.push_back(model.NewWorkspace(capacity));
    prompts.push_back(PromptIds(prompt, model.config().vocab_size, b));
  }
  // The prompts as one step, as the peer's context takes them.
  std::vector<BatchSequence> first(batch);
  for (int64_t b = 0; b < batch; ++b) {
    first[b].tokens = prompts[b];
    first[b].cache = &d->caches_[b];
    first[b].workspace = &d->workspaces_[b];
  }
  SCD_ASSIGN_OR_RETURN(std::vector<at::Tensor> logits, model.ForwardBatch(first));
  for (const at::Tensor& l : logits) d->next_.push_back(Argmax(l));
  return d;
}

absl::StatusOr<double> DecodingBatch::Steps(int64_t steps) {
  const int64_t batch = static_cast<int64_t>(next_.size());
  const auto start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<BatchSequence> seqs(batch);
    for (int64_t b = 0; b < batch; ++b) {
      seqs[b].tokens = absl::MakeConstSpan(&next_[b], 1);
      seqs[b].cache = &caches_[b];
      seqs[b].workspace = &workspaces_[b];
    }
    SCD_ASSIGN_OR_RETURN(std::vector<at::Tensor> logits, model_.ForwardBatch(seqs));
    for (int64_t b = 0; b < batch; ++b) next_[b] = Argmax(logits[b]);
  }
  return SecondsSince(start);
}

namespace {

// Tokens/s of `batch` sequences decoding together.
absl::StatusOr<double> DecodeRate(const LlamaModel& model, int64_t batch,
                                  const EngineBenchOptions& o) {
  SCD_ASSIGN_OR_RETURN(
      std::unique_ptr<DecodingBatch> d,
      DecodingBatch::Start(model, batch, o.decode_prompt,
                           o.decode_prompt + o.warmup_steps + o.decode_steps + 1));
  SCD_RETURN_IF_ERROR(d->Steps(o.warmup_steps).status());
  SCD_ASSIGN_OR_RETURN(double seconds, d->Steps(o.decode_steps));
  return static_cast<double>(batch * o.decode_steps) / seconds;
}

}  // namespace

double ProjectionBandwidth(const LlamaModel& model, int reps) {
  const int64_t d = model.config().hidden_size;
  at::Tensor x = at::randn({1, d});
  int64_t bytes = 0;
  auto once = [&](const LayerWeights& w) {
    if (!w.packed_gate_up.empty()) {
      bytes += w.packed_gate_up.bytes();
      return w.packed_gate_up.Apply(x, at::Tensor());
    }
    bytes += w.w_gate_up.numel() * static_cast<int64_t>(w.w_gate_up.element_size());
    at::Tensor y;
    if (!SkinnyGemm(x, w.w_gate_up, at::Tensor(), &y)) y = at::mm(x, w.w_gate_up.t());
    return y;
  };
  const auto start = Clock::now();
  for (int r = 0; r < reps; ++r) {
    for (const LayerWeights& w : model.weights().layers) once(w);
  }
  return static_cast<double>(bytes) / SecondsSince(start) / 1e9;
}

std::vector<TokenId> PromptIds(int64_t length, int64_t vocab, int64_t salt) {
  std::vector<TokenId> ids(length);
  const int64_t span = std::max<int64_t>(1, vocab - 3);
  for (int64_t i = 0; i < length; ++i) {
    ids[i] = static_cast<TokenId>(3 + (i * 7919 + salt * 104729 + 13) % span);
  }
  return ids;
}

std::string EngineReport::ToJson(const std::string& extra_fields) const {
  std::string cells_json;
  for (const EngineCell& c : cells) {
    absl::StrAppendFormat(&cells_json, "%s{\"kind\": \"%s\", \"size\": %d, \"value\": %.6g, "
                          "\"rate\": %.6g}",
                          cells_json.empty() ? "" : ", ", c.kind, c.size, c.value, c.rate);
  }
  return absl::StrFormat(
      "{%s%s\"engine\": \"scd\", \"cells\": [%s], \"rss_loaded_bytes\": %d, "
      "\"rss_end_bytes\": %d, \"load_seconds\": %.3f}",
      extra_fields, extra_fields.empty() ? "" : ", ", cells_json, rss_loaded, rss_end,
      load_seconds);
}

absl::StatusOr<EngineReport> RunEngineBench(const LlamaModel& model,
                                            const EngineBenchOptions& o) {
  EngineReport report;
  report.rss_loaded = ResidentBytes();
  // One untimed pass first: pages of the weights, the allocator's pools, the threads.
  SCD_RETURN_IF_ERROR(TimeToFirstToken(model, PromptIds(16, model.config().vocab_size, 99)).status());
  for (int64_t length : o.prompt_lengths) {
    const std::vector<TokenId> ids = PromptIds(length, model.config().vocab_size, 0);
    std::vector<double> times;
    const int repeats = length >= 512 ? o.long_repeats : o.repeats;
    for (int r = 0; r < repeats; ++r) {
      SCD_ASSIGN_OR_RETURN(double t, TimeToFirstToken(model, ids));
      times.push_back(t);
    }
    const double t = Median(times);
    report.cells.push_back({"ttft", length, 1e3 * t, static_cast<double>(length) / t});
  }
  for (int64_t batch : o.batch_sizes) {
    SCD_ASSIGN_OR_RETURN(double rate, DecodeRate(model, batch, o));
    report.cells.push_back({"decode", batch, rate, rate});
  }
  report.rss_end = ResidentBytes();
  return report;
}

}  // namespace scd::bench
