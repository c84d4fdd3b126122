// The frontier's protocol forms (torch-free): a point as v1::CodePoint (DecodeRequest,
// PrefillTarget, Started) and a whole frontier inside v1::ArtifactEntry (the consumer's
// registration), both ways. Reading checks what a peer could have got wrong: unknown precisions,
// ranks out of range, points out of order.
// Thread-safety: pure functions.
#ifndef SCD_PROTO_FRONTIER_PROTO_H_
#define SCD_PROTO_FRONTIER_PROTO_H_

#include "absl/status/statusor.h"
#include "codec/frontier.h"
#include "scd/v1/registry.pb.h"

namespace scd {

v1::CodePoint CodePointToProto(const FrontierPoint& point);
// Precision and ranks only (the measured fields stay 0). INVALID_ARGUMENT: an unknown precision,
// rank lists of different lengths, more than 1,024 layers or a rank above 65,536.
absl::StatusOr<FrontierPoint> CodePointFromProto(const v1::CodePoint& point);

void FrontierToEntry(const Frontier& frontier, v1::ArtifactEntry* entry);
// Empty when the entry carries none. INVALID_ARGUMENT as CodePointFromProto, or for
// non-finite or negative measurements, points not ascending in bytes, a recommended index
// outside the points.
absl::StatusOr<Frontier> FrontierFromEntry(const v1::ArtifactEntry& entry);

}  // namespace scd

#endif  // SCD_PROTO_FRONTIER_PROTO_H_
