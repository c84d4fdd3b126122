#include "proto/wire_mode.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/log_text.h"

// The deprecated `mode` fields are read and written here alone.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace scd {
namespace {

std::atomic<int64_t> mode_names_parsed{0};

// The wire's values are the codec's plus 2 (UNSPECIFIED = 0, AUTO = 1 come first).
constexpr int kWireOffset = 2;
static_assert(v1::TRANSFER_MODE_LOCAL == static_cast<int>(TransferMode::kLocal) + kWireOffset);
static_assert(v1::TRANSFER_MODE_RAW == static_cast<int>(TransferMode::kRaw) + kWireOffset);
static_assert(v1::TRANSFER_MODE_INT4 == static_cast<int>(TransferMode::kInt4) + kWireOffset);
static_assert(v1::TRANSFER_MODE_RECOMPUTE ==
              static_cast<int>(TransferMode::kRecompute) + kWireOffset);
static_assert(v1::TRANSFER_MODE_REUSE == static_cast<int>(TransferMode::kReuse) + kWireOffset);
static_assert(v1::TRANSFER_MODE_SCD == static_cast<int>(TransferMode::kScd) + kWireOffset);
static_assert(v1::TransferMode_MAX == v1::TRANSFER_MODE_SCD, "a wire mode the codec lacks");

absl::StatusOr<RequestedMode> FromWire(int value, const char* field) {
  if (!v1::TransferMode_IsValid(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " is not a TransferMode this server knows"));
  }
  if (value == v1::TRANSFER_MODE_AUTO) return RequestedMode::Auto();
  return RequestedMode(static_cast<TransferMode>(value - kWireOffset));
}

// The mode of a message with both fields (`auto_allowed`: a request's). The enum when set (the
// string, when there too, must name the same mode: compared, not parsed); else the string, parsed;
// else auto where allowed.
absl::StatusOr<RequestedMode> ModeOf(int wire, const std::string& name, const char* field,
                                     bool auto_allowed) {
  RequestedMode mode = RequestedMode::Auto();
  if (wire != v1::TRANSFER_MODE_UNSPECIFIED) {
    absl::StatusOr<RequestedMode> from_wire = FromWire(wire, field);
    if (!from_wire.ok()) return from_wire.status();
    if (!name.empty() && name != RequestedModeName(*from_wire)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", v1::TransferMode_Name(static_cast<v1::TransferMode>(wire)),
          " and the deprecated mode '", ForLog(name, 40), "' disagree"));
    }
    mode = *from_wire;
  } else if (!name.empty()) {
    mode_names_parsed.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<RequestedMode> parsed = ParseRequestedMode(name);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mode: unknown mode '", ForLog(name, 40),
          "' (auto, local, raw, int4, recompute, reuse, scd; or transfer_mode)"));
    }
    mode = *parsed;
  }
  if (mode.is_auto() && !auto_allowed) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a routed target needs a resolved mode, not auto"));
  }
  return mode;
}

TransferMode RanModeOf(int wire, const std::string& name, TransferMode otherwise) {
  if (wire != v1::TRANSFER_MODE_UNSPECIFIED) {
    absl::StatusOr<RequestedMode> mode = FromWire(wire, "transfer_mode");
    return mode.ok() && !mode->is_auto() ? mode->mode() : otherwise;
  }
  if (name.empty()) return otherwise;
  mode_names_parsed.fetch_add(1, std::memory_order_relaxed);
  return TransferModeOr(name, otherwise);
}

// A routed target's mode (DecodeRequest, PrefillTarget): neither field set is local.
template <typename Message>
absl::StatusOr<TransferMode> TargetMode(const Message& message) {
  if (message.transfer_mode() == v1::TRANSFER_MODE_UNSPECIFIED && message.mode().empty()) {
    return TransferMode::kLocal;
  }
  absl::StatusOr<RequestedMode> mode =
      ModeOf(message.transfer_mode(), message.mode(), "transfer_mode", false);
  if (!mode.ok()) return mode.status();
  return mode->mode();
}

}  // namespace

v1::TransferMode ToWire(TransferMode mode) {
  return static_cast<v1::TransferMode>(static_cast<int>(mode) + kWireOffset);
}

v1::TransferMode ToWire(RequestedMode mode) {
  return mode.is_auto() ? v1::TRANSFER_MODE_AUTO : ToWire(mode.mode());
}

absl::StatusOr<RequestedMode> RequestModeOf(const v1::GenerateRequest& request) {
  return ModeOf(request.transfer_mode(), request.mode(), "transfer_mode", true);
}

void SetRequestMode(RequestedMode mode, v1::GenerateRequest* request) {
  request->set_transfer_mode(ToWire(mode));
  request->clear_mode();
}

void SetRequestModeName(const std::string& name, v1::GenerateRequest* request) {
  absl::StatusOr<RequestedMode> mode = ParseRequestedMode(name);
  if (mode.ok()) return SetRequestMode(*mode, request);
  request->clear_transfer_mode();
  request->set_mode(name);
}

absl::StatusOr<TransferMode> TargetModeOf(const v1::DecodeRequest& request) {
  return TargetMode(request);
}

absl::StatusOr<TransferMode> TargetModeOf(const v1::PrefillTarget& target) {
  return TargetMode(target);
}

void SetTargetMode(TransferMode mode, v1::DecodeRequest* request) {
  request->set_transfer_mode(ToWire(mode));
  request->set_mode(TransferModeName(mode));
}

void SetTargetMode(TransferMode mode, v1::PrefillTarget* target) {
  target->set_transfer_mode(ToWire(mode));
  target->set_mode(TransferModeName(mode));
}

TransferMode RanMode(const v1::Started& started, TransferMode otherwise) {
  return RanModeOf(started.transfer_mode(), started.mode(), otherwise);
}

TransferMode RanMode(const v1::Finished& finished, TransferMode otherwise) {
  return RanModeOf(finished.transfer_mode(), finished.mode(), otherwise);
}

std::string RanModeName(const v1::Started& started) {
  return TransferModeName(RanMode(started));
}

std::string RanModeName(const v1::Finished& finished) {
  return TransferModeName(RanMode(finished));
}

void SetRanMode(TransferMode mode, v1::Started* started) {
  started->set_transfer_mode(ToWire(mode));
  started->set_mode(TransferModeName(mode));
}

void SetRanMode(TransferMode mode, v1::Finished* finished) {
  finished->set_transfer_mode(ToWire(mode));
  finished->set_mode(TransferModeName(mode));
}

int64_t ModeNamesParsed() { return mode_names_parsed.load(std::memory_order_relaxed); }

}  // namespace scd
