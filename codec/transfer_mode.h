// Transfer modes (method.md): what a producer sends a consumer for a prefix.
//   local      prompt only; the consumer runs its own prefill (the oracle)
//   raw        producer pre-RoPE K and V, f16
//   int4       the same, group-wise asymmetric int4
//   recompute  raw K/V on most layers; the consumer recomputes chosen layers from the hidden
//              state entering each recomputed segment (DroidSpeak-style)
//   reuse      reuse codes of K and V on every layer
//   scd        reuse codes on reuse layers, hidden-state codes on patch layers
// The enum's values are part of the code-batch wire form (codec/code_batch_wire.h): append new
// modes, never renumber.
// Thread-safety: stateless functions.
#ifndef SCD_CODEC_TRANSFER_MODE_H_
#define SCD_CODEC_TRANSFER_MODE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

enum class TransferMode { kLocal = 0, kRaw = 1, kInt4 = 2, kRecompute = 3, kReuse = 4, kScd = 5 };
inline constexpr TransferMode kAllTransferModes[] = {TransferMode::kLocal, TransferMode::kRaw,
                                                     TransferMode::kInt4,  TransferMode::kRecompute,
                                                     TransferMode::kReuse, TransferMode::kScd};

std::string TransferModeName(TransferMode mode);
absl::StatusOr<TransferMode> ParseTransferMode(const std::string& name);
// "local,raw,scd" -> modes, in order, without duplicates.
absl::StatusOr<std::vector<TransferMode>> ParseTransferModes(const std::string& list);
// Whether the mode needs a fitted artifact.
bool ModeNeedsArtifact(TransferMode mode);
// Whether a serving node hands the pair's artifact to the mode: the ones that need it, and
// recompute, which takes its layer list from it (a request carries no layer list).
bool ModeServedWithArtifact(TransferMode mode);

}  // namespace scd

#endif  // SCD_CODEC_TRANSFER_MODE_H_
