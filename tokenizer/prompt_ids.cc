#include "tokenizer/prompt_ids.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<std::vector<TokenId>> PromptTokenIds(const Tokenizer* tokenizer,
                                                    std::string_view text,
                                                    absl::Span<const int32_t> ids, int64_t vocab,
                                                    int64_t max_positions) {
  if (text.empty() == ids.empty()) {
    return absl::InvalidArgumentError("give exactly one of prompt and prompt_ids");
  }
  std::vector<TokenId> out;
  if (!text.empty()) {
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "prompt: this model is served without a tokenizer (dummy weights): send prompt_ids");
    }
    SCD_ASSIGN_OR_RETURN(out, tokenizer->Encode(text));
  } else {
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt id ", id, " is outside the vocabulary [0, ", vocab, ")"));
      }
      out.push_back(static_cast<TokenId>(id));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (static_cast<int64_t>(out.size()) > max_positions) {
    return absl::OutOfRangeError(absl::StrCat("the prompt has ", out.size(),
                                              " tokens; the model takes at most ", max_positions));
  }
  return out;
}

}  // namespace scd
