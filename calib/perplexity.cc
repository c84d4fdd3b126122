#include "calib/perplexity.h"

#include <ATen/ATen.h>

#include <cmath>

#include "base/exception_guard.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<PerplexityResult> Perplexity(const LlamaModel& model,
                                            const std::vector<std::vector<TokenId>>& sequences) {
  return GuardExceptions("Perplexity", [&]() -> absl::StatusOr<PerplexityResult> {
    double total = 0;
    int64_t count = 0;
    for (const std::vector<TokenId>& seq : sequences) {
      if (seq.size() < 2) continue;
      KvCache cache = model.NewCache(static_cast<int64_t>(seq.size()));
      ForwardOptions options;
      options.logits = LogitsMode::kAll;
      SCD_ASSIGN_OR_RETURN(ForwardOutput out, model.Forward(seq, &cache, options));
      const int64_t T = static_cast<int64_t>(seq.size());
      const at::Tensor logp = at::log_softmax(out.logits.narrow(0, 0, T - 1).to(at::kDouble), -1);
      at::Tensor next = at::empty({T - 1}, at::kLong);
      for (int64_t t = 1; t < T; ++t) next[t - 1] = seq[t];
      total -= logp.gather(1, next.unsqueeze(1)).sum().item<double>();
      count += T - 1;
    }
    if (count == 0) return absl::InvalidArgumentError("no sequence of two tokens or more");
    PerplexityResult r;
    r.tokens = count;
    r.nll = total / static_cast<double>(count);
    r.ppl = std::exp(r.nll);
    return r;
  });
}

absl::StatusOr<std::vector<std::vector<TokenId>>> GreedyContinuations(
    const LlamaModel& model, const std::vector<std::vector<TokenId>>& prompts, int tokens) {
  return GuardExceptions("GreedyContinuations",
                         [&]() -> absl::StatusOr<std::vector<std::vector<TokenId>>> {
    std::vector<std::vector<TokenId>> out;
    for (const std::vector<TokenId>& prompt : prompts) {
      KvCache cache = model.NewCache(static_cast<int64_t>(prompt.size()) + tokens);
      SCD_ASSIGN_OR_RETURN(ForwardOutput step, model.Forward(prompt, &cache));
      std::vector<TokenId> got;
      for (int i = 0; i < tokens; ++i) {
        got.push_back(static_cast<TokenId>(step.logits.reshape({-1}).argmax().item<int64_t>()));
        if (i + 1 == tokens) break;
        SCD_ASSIGN_OR_RETURN(step, model.Forward(absl::MakeConstSpan(&got.back(), 1), &cache));
      }
      out.push_back(std::move(got));
    }
    return out;
  });
}

GreedyAgreement CompareGreedy(const std::vector<std::vector<TokenId>>& a,
                              const std::vector<std::vector<TokenId>>& b) {
  GreedyAgreement g;
  int64_t same = 0, total = 0;
  for (size_t p = 0; p < a.size() && p < b.size(); ++p) {
    bool identical = a[p].size() == b[p].size();
    for (size_t i = 0; i < a[p].size() && i < b[p].size(); ++i) {
      same += a[p][i] == b[p][i];
      identical = identical && a[p][i] == b[p][i];
      ++total;
    }
    g.identical += identical;
    ++g.prompts;
  }
  g.positions = total > 0 ? static_cast<double>(same) / static_cast<double>(total) : 0;
  return g;
}

}  // namespace scd
