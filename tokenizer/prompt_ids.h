// The token ids of a request's prompt, the same way on every node (producer and consumer tokenize
// the same request independently; the pair shares a tokenizer, so they agree): the given ids, or
// the text tokenized with the tokenizer's special tokens. A model served without a tokenizer
// (dummy weights on a bare config) takes ids only.
// Thread-safety: reentrant.
#ifndef SCD_TOKENIZER_PROMPT_IDS_H_
#define SCD_TOKENIZER_PROMPT_IDS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "tokenizer/tokenizer.h"

namespace scd {

// INVALID_ARGUMENT: neither or both of `text` and `ids` given, text with no `tokenizer` (null),
// no tokens, an id outside [0, vocab); OUT_OF_RANGE: more than `max_positions` tokens.
absl::StatusOr<std::vector<TokenId>> PromptTokenIds(const Tokenizer* tokenizer,
                                                    std::string_view text,
                                                    absl::Span<const int32_t> ids, int64_t vocab,
                                                    int64_t max_positions);

}  // namespace scd

#endif  // SCD_TOKENIZER_PROMPT_IDS_H_
