// Transfer modes on the wire: the TransferMode enum fields of inference.proto and control.proto,
// and the string fields named `mode` they replace (deprecated; accepted for one release). Every
// read and write of a mode in a message goes through here, so a mode name is parsed only where a
// message from an older peer or client carries one (counted: ModeNamesParsed), and a node that
// read a request's mode forwards the enum alone (SetRequestMode).
//   - reading: the enum when set; else the string; an enum value this build does not know, a
//     name it does not know, or an enum and a string naming different modes: INVALID_ARGUMENT.
//   - writing events and control messages: both fields (nodes and clients of the last release
//     read the string); requests: the enum alone.
// Thread-safety: stateless but for the process-wide counter (atomic).
#ifndef SCD_PROTO_WIRE_MODE_H_
#define SCD_PROTO_WIRE_MODE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "codec/transfer_mode.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/inference.pb.h"

namespace scd {

v1::TransferMode ToWire(TransferMode mode);
v1::TransferMode ToWire(RequestedMode mode);  // AUTO for auto

// A request's mode (UNSPECIFIED and no string: auto).
absl::StatusOr<RequestedMode> RequestModeOf(const v1::GenerateRequest& request);
// Sets transfer_mode and clears the deprecated string.
void SetRequestMode(RequestedMode mode, v1::GenerateRequest* request);

// A client's edge (a CLI flag, a config file): the mode named ("" and "auto": auto) as the enum;
// a name this build does not know goes as the deprecated string, for the server to refuse by
// name as it refuses any unknown mode.
void SetRequestModeName(const std::string& name, v1::GenerateRequest* request);

// A routed target's mode, resolved by the coordinator: AUTO is refused; neither field set: local.
absl::StatusOr<TransferMode> TargetModeOf(const v1::DecodeRequest& request);
absl::StatusOr<TransferMode> TargetModeOf(const v1::PrefillTarget& target);
void SetTargetMode(TransferMode mode, v1::DecodeRequest* request);
void SetTargetMode(TransferMode mode, v1::PrefillTarget* target);

// The mode an event says ran; `otherwise` when it names none this build knows (a newer peer's).
TransferMode RanMode(const v1::Started& started, TransferMode otherwise = TransferMode::kLocal);
TransferMode RanMode(const v1::Finished& finished, TransferMode otherwise = TransferMode::kLocal);
// RanMode's name, for output at the edges (logs, JSON, CSV, tests).
std::string RanModeName(const v1::Started& started);
std::string RanModeName(const v1::Finished& finished);
void SetRanMode(TransferMode mode, v1::Started* started);
void SetRanMode(TransferMode mode, v1::Finished* finished);

// Mode names parsed from the deprecated string fields in this process so far.
int64_t ModeNamesParsed();

}  // namespace scd

#endif  // SCD_PROTO_WIRE_MODE_H_
