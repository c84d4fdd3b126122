#include "calib/continuation.h"

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<ContinuationReport> CompareContinuations(const ModelPair& pair,
                                                        const Artifact* artifact,
                                                        const ContinuationOptions& options) {
  const LlamaModel& consumer = *pair.consumer;
  ContinuationReport report;
  SCD_ASSIGN_OR_RETURN(report.prompt_ids, pair.tokenizer->Encode(options.prompt));
  const std::vector<TokenId>& ids = report.prompt_ids;
  if (ids.size() < 2) {
    return absl::InvalidArgumentError("the prompt needs at least one token besides BOS");
  }
  // The transfer covers all but the last prompt token, which the consumer runs itself.
  const std::vector<TokenId> prefix(ids.begin(), ids.end() - 1);
  const int64_t capacity = static_cast<int64_t>(ids.size()) + options.generation.max_tokens;
  const double raw_f16 = static_cast<double>(consumer.config().KvBytesPerToken(2));
  auto finish = [&](TransferMode mode, const GenerationResult& g, double bytes_per_token) {
    Continuation c;
    c.mode = mode;
    c.output_ids = g.output_ids;
    std::vector<TokenId> all = ids;
    all.insert(all.end(), g.output_ids.begin(), g.output_ids.end());
    c.text = pair.tokenizer->Decode(all, /*skip_special_tokens=*/true);
    c.bytes_per_token = bytes_per_token;
    c.payload_ratio = bytes_per_token / raw_f16;
    const std::vector<TokenId>& own =
        report.runs.empty() ? g.output_ids : report.runs[0].output_ids;
    while (c.agreeing_tokens < own.size() && c.agreeing_tokens < g.output_ids.size() &&
           own[c.agreeing_tokens] == g.output_ids[c.agreeing_tokens]) {
      ++c.agreeing_tokens;
    }
    report.runs.push_back(std::move(c));
  };
  KvCache own = consumer.NewCache(capacity);
  SCD_ASSIGN_OR_RETURN(GenerationResult local,
                       GenerateTokens(consumer, ids, &own, options.generation));
  finish(TransferMode::kLocal, local, 0);
  for (TransferMode mode : options.modes) {
    SCD_ASSIGN_OR_RETURN(TransferPath path, TransferPath::Create(mode, *pair.producer, consumer,
                                                                 artifact, options.transfer));
    KvCache rebuilt = consumer.NewCache(capacity);
    SCD_ASSIGN_OR_RETURN(TransferStats stats, path.Run(prefix, &rebuilt, options.hand_off));
    SCD_ASSIGN_OR_RETURN(GenerationResult g,
                         GenerateTokens(consumer, ids, &rebuilt, options.generation));
    finish(mode, g, static_cast<double>(stats.payload_bytes) / static_cast<double>(stats.tokens));
  }
  return report;
}

std::string FormatContinuations(const ContinuationReport& report, const std::string& consumer_name,
                                const std::string& prompt) {
  std::string out = absl::StrFormat("prompt (%d tokens): %s\n\n", report.prompt_ids.size(), prompt);
  const size_t own_tokens = report.runs.empty() ? 0 : report.runs[0].output_ids.size();
  for (const Continuation& c : report.runs) {
    if (c.mode == TransferMode::kLocal) {
      absl::StrAppendFormat(&out, "[%s, own prefill]\n%s\n\n", consumer_name, c.text);
      continue;
    }
    absl::StrAppendFormat(&out,
                          "[%s from a %s transfer: %.0f bytes/token, %.1f%% of raw f16 KV; first "
                          "%d of %d tokens as its own]\n%s\n\n",
                          consumer_name, TransferModeName(c.mode), c.bytes_per_token,
                          100 * c.payload_ratio, c.agreeing_tokens, own_tokens, c.text);
  }
  return out;
}

}  // namespace scd
