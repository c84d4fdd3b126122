// The one validation step in front of routing: a GenerateRequest is checked against the bounds
// written in inference.proto before any node does work (the coordinator before it routes, a
// consumer before it admits), and a request outside them is refused as a whole with
// INVALID_ARGUMENT (malformed: both or neither prompt form, bad UTF-8, a request_id outside its
// charset, an unknown mode, a duplicate or empty target) or OUT_OF_RANGE (a number or a length
// past its bound), the message naming the field. Values from the client appear in messages
// escaped and cut (base/log_text.h). What depends on the model (vocabulary, positions) is checked
// by the consumer (consumer/request_runner.h).
// Thread-safety: stateless functions.
#ifndef SCD_PROTO_REQUEST_VALIDATION_H_
#define SCD_PROTO_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "codec/transfer_mode.h"
#include "scd/v1/inference.pb.h"

namespace scd {

// The bounds inference.proto states; a daemon may lower them.
struct RequestLimits {
  size_t max_prompt_bytes = size_t{1} << 20;
  size_t max_prompt_ids = size_t{1} << 20;
  size_t max_targets = 16;
  size_t max_target_bytes = 128;
  size_t max_request_id_bytes = 128;
  size_t max_stops = 16;
  size_t max_stop_bytes = 256;
  size_t max_cache_salt_bytes = 256;
  double max_kl = 10;  // nats per token: far beyond any useful budget (raw across weights ~1.2)
  uint32_t max_tokens = uint32_t{1} << 20;
  uint32_t max_top_k = uint32_t{1} << 20;
  uint32_t max_logprobs = 20;
  float max_temperature = 100;
  uint32_t max_deadline_ms = 3600 * 1000;
  uint32_t max_ttft_slo_ms = 3600 * 1000;
};

// The generation values alone (max_tokens, temperature, top_p, top_k, logprobs, stop): what a
// consumer re-checks cheaply where it turns them into sampling options (no prompt scan).
absl::Status ValidateGenerationValues(const v1::GenerateRequest& request,
                                      const RequestLimits& limits = {});

// A link shape (control.proto): gbps finite in [0, 1e6], latency_us finite in [0, 1e7];
// INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateLinkShape(const v1::LinkShape& shape);

// OK, or the first field out of bounds (see the header comment). `require_target`: the
// coordinator needs at least one target; a consumer called directly serves its own model.
// `mode` (may be null) gets the request's mode, read once (proto/wire_mode.h RequestModeOf).
absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     const RequestLimits& limits = {}, bool require_target = true,
                                     RequestedMode* mode = nullptr);

// What an unset field means, read in one place: whether the consumer may fall back to its own
// prefill when the request's transfer fails (GenerateRequest.allow_local_fallback: unset allows
// it, false forbids it).
bool LocalFallbackAllowed(const v1::GenerateRequest& request);

}  // namespace scd

#endif  // SCD_PROTO_REQUEST_VALIDATION_H_
