// Frontier (torch-free): one pair's calibrated quality against bytes (scd-calib fit, stored in the
// artifact). Each point is a full description of what scd sends — the code precision and every
// layer's key, value and hidden-code rank — with what it cost when it was measured: payload bytes
// per prompt token, the KL of the consumer's next-token distribution against its own prefill on
// held-out windows, and the producer's encode and the consumer's rebuild time per token. Points are
// sorted by bytes; within one precision the ranks only grow with the bytes, so a lower point's
// codes are a prefix of a higher point's (the nested codes: codec/reuse_translator.h).
// TransferOptions::AtPoint (codec/transfer_plan.h) sends a point.
// Thread-safety: plain value types.
#ifndef SCD_CODEC_FRONTIER_H_
#define SCD_CODEC_FRONTIER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/wire_dtype.h"

namespace scd {

// What an artifact allows per layer: the highest rank of each code kind, 0 where that kind does
// not travel (Artifact::FrontierLimits()).
struct RankLimits {
  std::vector<int64_t> max_k, max_v, max_h;
};

struct FrontierPoint {
  WireDtype code_dtype = WireDtype::kF16;
  // One entry per layer; 0 where that kind of code does not travel (patch layers send no K/V
  // codes, reuse layers no hidden code).
  std::vector<int64_t> rank_k, rank_v, rank_h;
  double bytes_per_token = 0;       // measured payload bytes per prompt token
  double payload_ratio = 0;         // bytes_per_token / the consumer's raw f16 KV bytes per token
  double kl = 0;                    // measured on the fit's held-out windows
  double predicted_kl = 0;          // what the greedy allocation expected (kl checks it)
  double encode_us_per_token = 0;   // producer: prefill with capture + encode
  double rebuild_us_per_token = 0;  // consumer: cache rebuild from the codes

  // True when every rank of this point is at most `other`'s at the same precision: this point's
  // codes are then a prefix of `other`'s.
  bool NestedIn(const FrontierPoint& other) const;
  // "int4 K 6,6,.. V 12,.. H ..,64" (compact, for logs and reasons).
  std::string Describe() const;
};

// A point's ranks against `limits`: one per layer, each code that travels at rank 1 or more and
// within its limit, none where the limit is 0. INVALID_ARGUMENT naming the layer otherwise.
absl::Status CheckPoint(const FrontierPoint& point, const RankLimits& limits);

struct Frontier {
  // Ascending bytes_per_token; KL falls strictly, except that the fitted configuration (every
  // code at full rank, f16) is kept as the top point when a cheaper point measured as well.
  std::vector<FrontierPoint> points;
  int recommended = -1;  // index of the point served when no budget is given
  double raw_f16_bytes_per_token = 0;
  std::string heldout;  // the split the KLs were measured on

  bool empty() const { return points.empty(); }
  // The cheapest point whose KL is at most `max_kl`; null when none is.
  const FrontierPoint* CheapestWithin(double max_kl) const;
  // The point of lowest KL; null when empty.
  const FrontierPoint* BestQuality() const { return BestUnder(1e300); }
  // The best-quality point of at most `bytes_per_token`; null when every point is larger.
  const FrontierPoint* BestUnder(double bytes_per_token) const;

  std::string ToJson() const;
  // Parses and checks the document against `limits`: one rank per layer, each code that
  // travels at rank 1 or more and within its limit, none where the limit is 0.
  static absl::StatusOr<Frontier> FromJson(const std::string& text, const RankLimits& limits);
  absl::Status CheckAgainst(const RankLimits& limits) const;
};

}  // namespace scd

#endif  // SCD_CODEC_FRONTIER_H_
