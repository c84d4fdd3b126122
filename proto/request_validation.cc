#include "proto/request_validation.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/log_text.h"
#include "codec/transfer_mode.h"
#include "proto/wire_mode.h"

namespace scd {
namespace {

absl::Status Utf8(const std::string& field, const std::string& value) {
  size_t bad = 0;
  if (IsValidUtf8(value, &bad)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": not valid UTF-8 (byte ", bad, " of ", value.size(), ")"));
}

absl::Status Length(const std::string& field, size_t size, size_t limit, const char* unit) {
  if (size <= limit) return absl::OkStatus();
  return absl::OutOfRangeError(
      absl::StrCat(field, ": ", size, " ", unit, ", more than the limit of ", limit));
}

// The generation values, the mode already read.
absl::Status ValidateValues(const v1::GenerateRequest& request, const RequestLimits& limits,
                            RequestedMode mode);

}  // namespace

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     const RequestLimits& limits, bool require_target,
                                     RequestedMode* mode_out) {
  // request_id first: every later message may name it.
  const std::string& id = request.request_id();
  if (id.size() > limits.max_request_id_bytes || !IsPrintableAscii(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", limits.max_request_id_bytes,
                     " printable ASCII characters without spaces (got ", id.size(), " bytes: '",
                     ForLog(id, 32), "')"));
  }
  const bool has_text = !request.prompt().empty(), has_ids = request.prompt_ids_size() > 0;
  if (has_text && has_ids) {
    return absl::InvalidArgumentError("prompt and prompt_ids: give exactly one, not both");
  }
  if (!has_text && !has_ids) {
    return absl::InvalidArgumentError("prompt: empty (give prompt text or prompt_ids)");
  }
  if (absl::Status s = Length("prompt", request.prompt().size(), limits.max_prompt_bytes, "bytes");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Utf8("prompt", request.prompt()); !s.ok()) return s;
  if (absl::Status s = Length("prompt_ids", static_cast<size_t>(request.prompt_ids_size()),
                              limits.max_prompt_ids, "ids");
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < request.prompt_ids_size(); ++i) {
    if (request.prompt_ids(i) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_ids[", i, "]: ", request.prompt_ids(i), " is negative"));
    }
  }
  if (require_target && request.targets().empty()) {
    return absl::InvalidArgumentError("targets: name at least one consumer model");
  }
  if (absl::Status s = Length("targets", static_cast<size_t>(request.targets_size()),
                              limits.max_targets, "targets");
      !s.ok()) {
    return s;
  }
  std::set<std::string> seen;
  for (int i = 0; i < request.targets_size(); ++i) {
    const std::string& target = request.targets(i);
    const std::string field = absl::StrCat("targets[", i, "]");
    if (target.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
    if (absl::Status s = Length(field, target.size(), limits.max_target_bytes, "bytes"); !s.ok()) {
      return s;
    }
    if (absl::Status s = Utf8(field, target); !s.ok()) return s;
    if (!seen.insert(target).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", ForLog(target), "' is named twice"));
    }
  }
  absl::StatusOr<RequestedMode> mode = RequestModeOf(request);  // the one parse on this node
  if (!mode.ok()) return mode.status();
  if (mode_out != nullptr) *mode_out = *mode;
  return ValidateValues(request, limits, *mode);
}

absl::Status ValidateLinkShape(const v1::LinkShape& shape) {
  if (!std::isfinite(shape.gbps()) || shape.gbps() < 0 || shape.gbps() > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape.gbps: ", shape.gbps(), " is not in [0, 1e6] Gbit/s (0: unlimited)"));
  }
  if (!std::isfinite(shape.latency_us()) || shape.latency_us() < 0 || shape.latency_us() > 1e7) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape.latency_us: ", shape.latency_us(), " is not in [0, 1e7] us"));
  }
  return absl::OkStatus();
}

bool LocalFallbackAllowed(const v1::GenerateRequest& request) {
  return !request.has_allow_local_fallback() || request.allow_local_fallback();
}

absl::Status ValidateGenerationValues(const v1::GenerateRequest& request,
                                      const RequestLimits& limits) {
  absl::StatusOr<RequestedMode> mode = RequestModeOf(request);
  if (!mode.ok()) return mode.status();
  return ValidateValues(request, limits, *mode);
}

namespace {

absl::Status ValidateValues(const v1::GenerateRequest& request, const RequestLimits& limits,
                            RequestedMode mode) {
  if (request.max_tokens() > limits.max_tokens) {
    return absl::OutOfRangeError(absl::StrCat("max_tokens: ", request.max_tokens(),
                                              " is more than the limit of ", limits.max_tokens));
  }
  const float temperature = request.temperature();
  if (!std::isfinite(temperature) || temperature < 0 || temperature > limits.max_temperature) {
    return absl::OutOfRangeError(
        absl::StrCat("temperature: ", temperature, " is not in [0, ", limits.max_temperature, "]"));
  }
  const float top_p = request.top_p();
  if (!std::isfinite(top_p) || top_p < 0 || top_p > 1) {
    return absl::OutOfRangeError(absl::StrCat("top_p: ", top_p, " is not in [0, 1] (0 or 1: off)"));
  }
  if (request.top_k() > limits.max_top_k) {
    return absl::OutOfRangeError(
        absl::StrCat("top_k: ", request.top_k(), " is more than the limit of ", limits.max_top_k));
  }
  if (request.logprobs() > limits.max_logprobs) {
    return absl::OutOfRangeError(absl::StrCat("logprobs: ", request.logprobs(),
                                              " is more than the limit of ", limits.max_logprobs));
  }
  if (absl::Status s =
          Length("stop", static_cast<size_t>(request.stop_size()), limits.max_stops, "strings");
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    const std::string field = absl::StrCat("stop[", i, "]");
    const std::string& stop = request.stop(i);
    if (stop.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
    if (absl::Status s = Length(field, stop.size(), limits.max_stop_bytes, "bytes"); !s.ok()) {
      return s;
    }
    if (absl::Status s = Utf8(field, stop); !s.ok()) return s;
  }
  if (absl::Status s =
          Length("cache_salt", request.cache_salt().size(), limits.max_cache_salt_bytes, "bytes");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Utf8("cache_salt", request.cache_salt()); !s.ok()) return s;
  const double max_kl = request.max_kl();
  if (!std::isfinite(max_kl) || max_kl < 0 || max_kl > limits.max_kl) {
    return absl::OutOfRangeError(absl::StrCat("max_kl: ", max_kl, " is not in [0, ", limits.max_kl,
                                              "] (nats per token; 0: the recommended point)"));
  }
  const bool is_auto = mode.is_auto();
  if (max_kl > 0 && !is_auto && !mode.Is(TransferMode::kScd)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_kl: a quality budget chooses among scd's frontier points, so it needs mode auto or "
        "scd, not ",
        RequestedModeName(mode)));
  }
  if (request.ttft_slo_ms() > limits.max_ttft_slo_ms) {
    return absl::OutOfRangeError(absl::StrCat("ttft_slo_ms: ", request.ttft_slo_ms(),
                                              " is more than the limit of ",
                                              limits.max_ttft_slo_ms));
  }
  if (request.ttft_slo_ms() > 0 && !is_auto) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttft_slo_ms: a time-to-first-token objective chooses the mode, so it needs mode auto, "
        "not ",
        RequestedModeName(mode)));
  }
  if (request.keep_ranks() && !is_auto) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keep_ranks: only auto adapts a point's ranks to the link, so it needs mode auto, not ",
        RequestedModeName(mode)));
  }
  if (request.deadline_ms() > limits.max_deadline_ms) {
    return absl::OutOfRangeError(absl::StrCat("deadline_ms: ", request.deadline_ms(),
                                              " is more than the limit of ",
                                              limits.max_deadline_ms));
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace scd
