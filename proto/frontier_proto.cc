#include "proto/frontier_proto.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {

namespace {

constexpr int kMaxLayers = 1024;
constexpr uint32_t kMaxRank = 65536;

absl::StatusOr<std::vector<int64_t>> Ranks(const google::protobuf::RepeatedField<uint32_t>& in,
                                           const char* name) {
  std::vector<int64_t> out;
  for (uint32_t r : in) {
    if (r > kMaxRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("code point ", name, " holds rank ", r, " (at most ", kMaxRank, ")"));
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace

v1::CodePoint CodePointToProto(const FrontierPoint& point) {
  v1::CodePoint out;
  out.set_code_dtype(WireDtypeName(point.code_dtype));
  for (int64_t r : point.rank_k) out.add_rank_k(static_cast<uint32_t>(r));
  for (int64_t r : point.rank_v) out.add_rank_v(static_cast<uint32_t>(r));
  for (int64_t r : point.rank_h) out.add_rank_h(static_cast<uint32_t>(r));
  return out;
}

absl::StatusOr<FrontierPoint> CodePointFromProto(const v1::CodePoint& point) {
  FrontierPoint out;
  SCD_ASSIGN_OR_RETURN(out.code_dtype, ParseWireDtype(point.code_dtype()));
  if (point.rank_k_size() != point.rank_v_size() || point.rank_k_size() != point.rank_h_size() ||
      point.rank_k_size() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("code point ranks for ", point.rank_k_size(), "/", point.rank_v_size(), "/",
                     point.rank_h_size(),
                     " layers (one list per code kind, equal lengths, at most ", kMaxLayers, ")"));
  }
  SCD_ASSIGN_OR_RETURN(out.rank_k, Ranks(point.rank_k(), "rank_k"));
  SCD_ASSIGN_OR_RETURN(out.rank_v, Ranks(point.rank_v(), "rank_v"));
  SCD_ASSIGN_OR_RETURN(out.rank_h, Ranks(point.rank_h(), "rank_h"));
  return out;
}

void FrontierToEntry(const Frontier& frontier, v1::ArtifactEntry* entry) {
  entry->clear_frontier();
  for (const FrontierPoint& p : frontier.points) {
    v1::FrontierPointEntry* e = entry->add_frontier();
    *e->mutable_point() = CodePointToProto(p);
    e->set_bytes_per_token(p.bytes_per_token);
    e->set_kl(p.kl);
    e->set_encode_us_per_token(p.encode_us_per_token);
    e->set_rebuild_us_per_token(p.rebuild_us_per_token);
  }
  entry->set_recommended(frontier.recommended > 0 ? static_cast<uint32_t>(frontier.recommended)
                                                  : 0);
}

absl::StatusOr<Frontier> FrontierFromEntry(const v1::ArtifactEntry& entry) {
  Frontier out;
  for (int i = 0; i < entry.frontier_size(); ++i) {
    const v1::FrontierPointEntry& e = entry.frontier(i);
    SCD_ASSIGN_OR_RETURN(FrontierPoint p, CodePointFromProto(e.point()));
    for (double v :
         {e.bytes_per_token(), e.kl(), e.encode_us_per_token(), e.rebuild_us_per_token()}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact ", entry.id(), " frontier point ", i,
                         ": a measurement is negative or not finite"));
      }
    }
    p.bytes_per_token = e.bytes_per_token();
    p.kl = e.kl();
    p.encode_us_per_token = e.encode_us_per_token();
    p.rebuild_us_per_token = e.rebuild_us_per_token();
    if (!out.points.empty() && p.bytes_per_token < out.points.back().bytes_per_token) {
      return absl::InvalidArgumentError(absl::StrCat("artifact ", entry.id(), " frontier point ", i,
                                                     ": points not ascending in bytes"));
    }
    if (!out.points.empty() && p.rank_k.size() != out.points.front().rank_k.size()) {
      return absl::InvalidArgumentError(absl::StrCat("artifact ", entry.id(), " frontier point ", i,
                                                     ": a different layer count"));
    }
    out.points.push_back(std::move(p));
  }
  if (out.points.empty()) return out;
  if (entry.recommended() >= out.points.size()) {
    return absl::InvalidArgumentError(absl::StrCat("artifact ", entry.id(),
                                                   " frontier recommends point ",
                                                   entry.recommended(), " of ", out.points.size()));
  }
  out.recommended = static_cast<int>(entry.recommended());
  return out;
}

}  // namespace scd
