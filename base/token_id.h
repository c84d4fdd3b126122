// TokenId: a vocabulary index, shared by the tokenizer, the model and the wire formats.
#ifndef SCD_BASE_TOKEN_ID_H_
#define SCD_BASE_TOKEN_ID_H_

#include <cstdint>

namespace scd {
using TokenId = int32_t;
}  // namespace scd

#endif  // SCD_BASE_TOKEN_ID_H_
