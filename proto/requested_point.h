// The frontier point a DecodeRequest or PrefillTarget names (the coordinator's choice), read and
// checked against what the node's own artifact can send, once for producer and consumer.
// Thread-safety: pure function.
#ifndef SCD_PROTO_REQUESTED_POINT_H_
#define SCD_PROTO_REQUESTED_POINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "codec/artifact.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "scd/v1/inference.pb.h"

namespace scd {

// INVALID_ARGUMENT starting "point: " for an unknown precision or malformed ranks, a mode other
// than scd, or ranks `artifact` (the one the mode uses; null for modes without one) cannot send.
absl::StatusOr<FrontierPoint> RequestedPoint(const v1::CodePoint& point, TransferMode mode,
                                             const Artifact* artifact,
                                             const std::string& artifact_id);

}  // namespace scd

#endif  // SCD_PROTO_REQUESTED_POINT_H_
