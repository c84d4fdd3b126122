#include "proto/requested_point.h"

#include "absl/strings/str_cat.h"
#include "base/log_text.h"
#include "proto/frontier_proto.h"

namespace scd {

absl::StatusOr<FrontierPoint> RequestedPoint(const v1::CodePoint& point, TransferMode mode,
                                             const Artifact* artifact,
                                             const std::string& artifact_id) {
  absl::StatusOr<FrontierPoint> p = CodePointFromProto(point);
  if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("point: ", p.status().message()));
  if (mode != TransferMode::kScd || artifact == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("point: a frontier point is for mode scd, not ", TransferModeName(mode)));
  }
  if (absl::Status s = CheckPoint(*p, artifact->FrontierLimits()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("point: not one artifact ", ForLog(artifact_id), " can send: ", s.message()));
  }
  return p;
}

}  // namespace scd
