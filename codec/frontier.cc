#include "codec/frontier.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace scd {

namespace {

using Json = nlohmann::json;

bool AllAtMost(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i]) return false;
  }
  return true;
}

Json PointToJson(const FrontierPoint& p) {
  return {{"code_dtype", WireDtypeName(p.code_dtype)},
          {"rank_k", p.rank_k},
          {"rank_v", p.rank_v},
          {"rank_h", p.rank_h},
          {"bytes_per_token", p.bytes_per_token},
          {"payload_ratio", p.payload_ratio},
          {"kl", p.kl},
          {"predicted_kl", p.predicted_kl},
          {"encode_us_per_token", p.encode_us_per_token},
          {"rebuild_us_per_token", p.rebuild_us_per_token}};
}

absl::StatusOr<std::vector<int64_t>> Ranks(const Json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("frontier point without a list ", key));
  }
  std::vector<int64_t> out;
  for (const Json& v : j[key]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("frontier ", key, " holds ", v.dump()));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

absl::StatusOr<double> Number(const Json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number() || !std::isfinite(j[key].get<double>()) ||
      j[key].get<double>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("frontier point needs a finite, non-negative ", key));
  }
  return j[key].get<double>();
}

absl::StatusOr<FrontierPoint> PointFromJson(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("frontier point is not an object");
  FrontierPoint p;
  SCD_ASSIGN_OR_RETURN(p.code_dtype, ParseWireDtype(j.value("code_dtype", "")));
  SCD_ASSIGN_OR_RETURN(p.rank_k, Ranks(j, "rank_k"));
  SCD_ASSIGN_OR_RETURN(p.rank_v, Ranks(j, "rank_v"));
  SCD_ASSIGN_OR_RETURN(p.rank_h, Ranks(j, "rank_h"));
  SCD_ASSIGN_OR_RETURN(p.bytes_per_token, Number(j, "bytes_per_token"));
  SCD_ASSIGN_OR_RETURN(p.payload_ratio, Number(j, "payload_ratio"));
  SCD_ASSIGN_OR_RETURN(p.kl, Number(j, "kl"));
  SCD_ASSIGN_OR_RETURN(p.predicted_kl, Number(j, "predicted_kl"));
  SCD_ASSIGN_OR_RETURN(p.encode_us_per_token, Number(j, "encode_us_per_token"));
  SCD_ASSIGN_OR_RETURN(p.rebuild_us_per_token, Number(j, "rebuild_us_per_token"));
  return p;
}

std::string RankList(const std::vector<int64_t>& ranks) {
  std::vector<int64_t> sent;
  for (int64_t r : ranks) {
    if (r > 0) sent.push_back(r);
  }
  return absl::StrJoin(sent, ",");
}

}  // namespace

bool FrontierPoint::NestedIn(const FrontierPoint& other) const {
  return code_dtype == other.code_dtype && AllAtMost(rank_k, other.rank_k) &&
         AllAtMost(rank_v, other.rank_v) && AllAtMost(rank_h, other.rank_h);
}

std::string FrontierPoint::Describe() const {
  std::string out =
      absl::StrCat(WireDtypeName(code_dtype), " K ", RankList(rank_k), " V ", RankList(rank_v));
  const std::string h = RankList(rank_h);
  if (!h.empty()) absl::StrAppend(&out, " H ", h);
  return out;
}

const FrontierPoint* Frontier::CheapestWithin(double max_kl) const {
  for (const FrontierPoint& p : points) {
    if (p.kl <= max_kl) return &p;
  }
  return nullptr;
}

const FrontierPoint* Frontier::BestUnder(double bytes_per_token) const {
  const FrontierPoint* best = nullptr;
  for (const FrontierPoint& p : points) {
    if (p.bytes_per_token <= bytes_per_token && (best == nullptr || p.kl < best->kl)) best = &p;
  }
  return best;
}

std::string Frontier::ToJson() const {
  Json points_json = Json::array();
  for (const FrontierPoint& p : points) points_json.push_back(PointToJson(p));
  return Json{{"points", points_json},
              {"recommended", recommended},
              {"raw_f16_bytes_per_token", raw_f16_bytes_per_token},
              {"heldout", heldout}}
      .dump();
}

absl::StatusOr<Frontier> Frontier::FromJson(const std::string& text, const RankLimits& limits) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("points") || !j["points"].is_array()) {
    return absl::InvalidArgumentError("scd.frontier is not an object with a list of points");
  }
  Frontier f;
  for (const Json& p : j["points"]) {
    SCD_ASSIGN_OR_RETURN(FrontierPoint point, PointFromJson(p));
    f.points.push_back(std::move(point));
  }
  if (!j.contains("recommended") || !j["recommended"].is_number_integer()) {
    return absl::InvalidArgumentError("scd.frontier has no recommended point");
  }
  f.recommended = j["recommended"].get<int>();
  SCD_ASSIGN_OR_RETURN(f.raw_f16_bytes_per_token, Number(j, "raw_f16_bytes_per_token"));
  f.heldout = j.value("heldout", "");
  SCD_RETURN_IF_ERROR(f.CheckAgainst(limits));
  return f;
}

absl::Status CheckPoint(const FrontierPoint& p, const RankLimits& limits) {
  const size_t layers = limits.max_k.size();
  if (p.code_dtype != WireDtype::kF16 && p.code_dtype != WireDtype::kInt8 &&
      p.code_dtype != WireDtype::kInt4) {
    return absl::InvalidArgumentError(
        absl::StrCat("code precision ", WireDtypeName(p.code_dtype), " (f16, int8 or int4)"));
  }
  if (p.rank_k.size() != layers || p.rank_v.size() != layers || p.rank_h.size() != layers ||
      limits.max_v.size() != layers || limits.max_h.size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat("ranks for ", p.rank_k.size(), "/",
                                                   p.rank_v.size(), "/", p.rank_h.size(),
                                                   " layers, the model has ", layers));
  }
  auto fits = [](int64_t rank, int64_t max) {
    return max == 0 ? rank == 0 : rank >= 1 && rank <= max;
  };
  for (size_t l = 0; l < layers; ++l) {
    if (!fits(p.rank_k[l], limits.max_k[l]) || !fits(p.rank_v[l], limits.max_v[l]) ||
        !fits(p.rank_h[l], limits.max_h[l])) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " ranks K/V/H ", p.rank_k[l], "/", p.rank_v[l], "/",
                       p.rank_h[l], " outside 1..", limits.max_k[l], "/", limits.max_v[l], "/",
                       limits.max_h[l], " (0 where that code does not travel)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Frontier::CheckAgainst(const RankLimits& limits) const {
  if (points.empty()) return absl::OkStatus();
  if (recommended < 0 || recommended >= static_cast<int>(points.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("frontier recommends point ", recommended, " of ", points.size()));
  }
  for (size_t i = 0; i < points.size(); ++i) {
    const FrontierPoint& p = points[i];
    if (absl::Status s = CheckPoint(p, limits); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("frontier point ", i, ": ", s.message()));
    }
    if (i > 0 && p.bytes_per_token < points[i - 1].bytes_per_token) {
      return absl::InvalidArgumentError(
          absl::StrCat("frontier point ", i, ": points are not in ascending bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace scd
