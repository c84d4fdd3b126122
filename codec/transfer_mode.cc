#include "codec/transfer_mode.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace scd {

std::string TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kLocal:
      return "local";
    case TransferMode::kRaw:
      return "raw";
    case TransferMode::kInt4:
      return "int4";
    case TransferMode::kRecompute:
      return "recompute";
    case TransferMode::kReuse:
      return "reuse";
    case TransferMode::kScd:
      return "scd";
  }
  return "?";
}

absl::StatusOr<TransferMode> ParseTransferMode(const std::string& name) {
  for (TransferMode m : kAllTransferModes) {
    if (TransferModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "transfer mode '", name, "' is not one of local, raw, int4, recompute, reuse, scd"));
}

absl::StatusOr<std::vector<TransferMode>> ParseTransferModes(const std::string& list) {
  std::vector<TransferMode> modes;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    SCD_ASSIGN_OR_RETURN(TransferMode m,
                         ParseTransferMode(std::string(absl::StripAsciiWhitespace(part))));
    if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
  }
  if (modes.empty()) return absl::InvalidArgumentError("no transfer modes given");
  return modes;
}

std::string RequestedModeName(RequestedMode mode) {
  return mode.is_auto() ? "auto" : TransferModeName(mode.mode());
}

absl::StatusOr<RequestedMode> ParseRequestedMode(const std::string& name) {
  if (name.empty() || name == "auto") return RequestedMode::Auto();
  absl::StatusOr<TransferMode> mode = ParseTransferMode(name);
  if (!mode.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mode '", name, "' is not one of auto, local, raw, int4, recompute, reuse, scd"));
  }
  return RequestedMode(*mode);
}

TransferMode TransferModeOr(const std::string& name, TransferMode otherwise) {
  absl::StatusOr<TransferMode> mode = ParseTransferMode(name);
  return mode.ok() ? *mode : otherwise;
}

bool ModeNeedsArtifact(TransferMode mode) {
  return mode == TransferMode::kReuse || mode == TransferMode::kScd;
}

bool ModeServedWithArtifact(TransferMode mode) {
  return ModeNeedsArtifact(mode) || mode == TransferMode::kRecompute;
}

}  // namespace scd
