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
// A request's mode: auto, a value of its own (the coordinator chooses per target: local prefill or
// a way to send the cache), or one transfer mode. Names are parsed only at the edges (proto, CLI,
// HTTP); inside, requests and routes carry this and TransferMode.
class RequestedMode {
 public:
  constexpr RequestedMode() = default;                                       // auto
  constexpr RequestedMode(TransferMode mode) : auto_(false), mode_(mode) {}  // NOLINT: implicit
  static constexpr RequestedMode Auto() { return RequestedMode(); }
  constexpr bool is_auto() const { return auto_; }
  // The transfer mode asked for; only when !is_auto().
  constexpr TransferMode mode() const { return mode_; }
  constexpr bool Is(TransferMode mode) const { return !auto_ && mode_ == mode; }
  friend constexpr bool operator==(RequestedMode a, RequestedMode b) {
    return a.auto_ == b.auto_ && (a.auto_ || a.mode_ == b.mode_);
  }
  friend constexpr bool operator!=(RequestedMode a, RequestedMode b) { return !(a == b); }

 private:
  bool auto_ = true;
  TransferMode mode_ = TransferMode::kLocal;
};

// "auto" or the mode's name.
std::string RequestedModeName(RequestedMode mode);
// "" and "auto" are auto; else a transfer mode's name. INVALID_ARGUMENT names the choices.
absl::StatusOr<RequestedMode> ParseRequestedMode(const std::string& name);
// A mode name read back from a peer's event (Started/Finished.mode): the mode, or `otherwise`
// for a name this build does not know (a newer peer's).
TransferMode TransferModeOr(const std::string& name, TransferMode otherwise);

// Whether the mode needs a fitted artifact.
bool ModeNeedsArtifact(TransferMode mode);
// Whether a serving node hands the pair's artifact to the mode: the ones that need it, and
// recompute, which takes its layer list from it (a request carries no layer list).
bool ModeServedWithArtifact(TransferMode mode);

}  // namespace scd

#endif  // SCD_CODEC_TRANSFER_MODE_H_
