#include "calib/synthetic_artifact.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "codec/transfer.h"
#include "codec/transfer_plan.h"

namespace scd {
namespace {

// [maps, dim, rank] with orthonormal columns per map.
at::Tensor OrthonormalColumns(int64_t maps, int64_t dim, int64_t rank, at::Generator& gen) {
  at::Tensor gaussian = at::randn({maps, dim, dim}, gen);
  at::Tensor q = std::get<0>(at::linalg_qr(gaussian));
  return q.narrow(2, 0, rank).contiguous();
}

ReuseTranslator RandomTranslator(int64_t maps, int64_t dim_in, int64_t dim_out, int64_t rank,
                                 at::Generator& gen) {
  at::Tensor enc = OrthonormalColumns(maps, dim_in, rank, gen);
  at::Tensor dec = OrthonormalColumns(maps, dim_out, rank, gen).transpose(1, 2).contiguous();
  return *ReuseTranslator::FromTensors(at::zeros({maps, dim_in}), at::zeros({maps, dim_out}), enc,
                                       dec);
}

absl::Status CheckRank(const char* what, int64_t rank, int64_t dim) {
  if (rank < 1 || rank > dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " rank ", rank, " is outside [1, ", dim, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckLayers(const char* what, const std::vector<int>& layers, int64_t count) {
  for (int layer : layers) {
    if (layer < 0 || layer >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " layer ", layer, " is outside [0, ", count, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Artifact> SynthesizeArtifact(const LlamaModel& producer, const LlamaModel& consumer,
                                            const SyntheticArtifactOptions& options) {
  const ModelConfig& a = producer.config();
  const ModelConfig& b = consumer.config();
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads ||
      a.head_dim != b.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pair must share layers, kv heads and head dim: producer ", a.num_layers,
                     "/", a.num_kv_heads, "/", a.head_dim, ", consumer ", b.num_layers, "/",
                     b.num_kv_heads, "/", b.head_dim));
  }
  SCD_RETURN_IF_ERROR(CheckRank("key", options.key_rank, a.head_dim));
  SCD_RETURN_IF_ERROR(CheckRank("value", options.value_rank, a.head_dim));
  SCD_RETURN_IF_ERROR(CheckLayers("patch", options.patch_layers, a.num_layers));
  SCD_RETURN_IF_ERROR(CheckLayers("recompute", options.recompute_layers, a.num_layers));
  if (!options.patch_layers.empty()) {
    SCD_RETURN_IF_ERROR(
        CheckRank("patch", options.patch_rank, std::min(a.hidden_size, b.hidden_size)));
  }
  return GuardExceptions("SynthesizeArtifact", [&]() -> absl::StatusOr<Artifact> {
    at::Generator gen = at::detail::createCPUGenerator(options.seed);
    Artifact artifact;
    SCD_ASSIGN_OR_RETURN(artifact.producer, ModelIdentity::Of(producer));
    SCD_ASSIGN_OR_RETURN(artifact.consumer, ModelIdentity::Of(consumer));
    for (int l = 0; l < a.num_layers; ++l) {
      ArtifactLayer layer;
      layer.key = RandomTranslator(a.num_kv_heads, a.head_dim, b.head_dim, options.key_rank, gen);
      layer.value =
          RandomTranslator(a.num_kv_heads, a.head_dim, b.head_dim, options.value_rank, gen);
      if (std::find(options.patch_layers.begin(), options.patch_layers.end(), l) !=
          options.patch_layers.end()) {
        layer.route = LayerRoute::kPatch;
        SCD_ASSIGN_OR_RETURN(layer.patch,
                             PatchAligner::Create(RandomTranslator(1, a.hidden_size, b.hidden_size,
                                                                   options.patch_rank, gen),
                                                  at::ones({options.patch_rank}), {}, {}));
      }
      artifact.layers.push_back(std::move(layer));
    }
    artifact.recompute_layers = options.recompute_layers;
    std::sort(artifact.recompute_layers.begin(), artifact.recompute_layers.end());
    artifact.fit_method = "synthetic";
    artifact.calibration_json = nlohmann::json{
        {"synthetic", true},
        {"seed", options.seed},
        {"key_rank", options.key_rank},
        {"value_rank", options.value_rank},
        {"patch_rank", options.patch_rank},
        {"patch_layers",
         options.patch_layers}}.dump();
    return artifact;
  });
}

namespace {

// One synthetic frontier point: `dtype` at `fraction` of the artifact's ranks, bytes and costs
// measured by sending `prefix` through the codec.
absl::StatusOr<FrontierPoint> MeasureSyntheticPoint(const LlamaModel& producer,
                                                    const LlamaModel& consumer,
                                                    const Artifact& artifact,
                                                    const std::vector<TokenId>& prefix,
                                                    WireDtype dtype, double fraction) {
  auto scaled = [fraction](int64_t rank) {
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(rank) *
                                                               fraction)));
  };
  FrontierPoint p;
  p.code_dtype = dtype;
  for (const ArtifactLayer& layer : artifact.layers) {
    const bool patch = layer.route == LayerRoute::kPatch;
    p.rank_k.push_back(patch ? 0 : scaled(layer.key.rank()));
    p.rank_v.push_back(patch ? 0 : scaled(layer.value.rank()));
    p.rank_h.push_back(patch ? scaled(layer.patch->rank()) : 0);
  }
  SCD_ASSIGN_OR_RETURN(TransferPath path,
                       TransferPath::Create(TransferMode::kScd, producer, consumer, &artifact,
                                            TransferOptions::AtPoint(p)));
  KvCache cache = consumer.NewCache(static_cast<int64_t>(prefix.size()) + 1);
  SCD_ASSIGN_OR_RETURN(TransferStats stats, path.Run(prefix, &cache));
  const double tokens = static_cast<double>(std::max<int64_t>(1, stats.tokens));
  p.bytes_per_token = static_cast<double>(stats.payload_bytes) / tokens;
  p.encode_us_per_token = stats.encode_seconds * 1e6 / tokens;
  p.rebuild_us_per_token = stats.decode_seconds * 1e6 / tokens;
  return p;
}

// The made-up KL of SyntheticFrontierOptions, and the point's share of raw f16 bytes.
void MakeUpKl(const FrontierPoint& full, double full_kl, double raw_f16, FrontierPoint* p) {
  const double precision = p->code_dtype == WireDtype::kInt4   ? 1.5
                           : p->code_dtype == WireDtype::kInt8 ? 1.15
                                                               : 1.0;
  p->kl = p->predicted_kl = full_kl * std::sqrt(full.bytes_per_token / p->bytes_per_token) *
                            precision;
  p->payload_ratio = raw_f16 > 0 ? p->bytes_per_token / raw_f16 : 0;
}

}  // namespace

absl::StatusOr<Frontier> SynthesizeFrontier(const LlamaModel& producer, const LlamaModel& consumer,
                                            const Artifact& artifact,
                                            const SyntheticFrontierOptions& options) {
  if (options.dtypes.empty() || options.fractions.empty() || options.probe_tokens < 2 ||
      !(options.full_kl > 0)) {
    return absl::InvalidArgumentError(
        "synthetic frontier: needs precisions, fractions, a probe of 2+ tokens and a KL > 0");
  }
  for (double f : options.fractions) {
    if (!(f > 0 && f <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic frontier: fraction ", f, " is not in (0, 1]"));
    }
  }
  std::mt19937_64 rng(options.seed);  // the probe: random ids, as a dummy model's prompts are
  std::uniform_int_distribution<int64_t> id(3, producer.config().vocab_size - 1);
  std::vector<TokenId> prefix(static_cast<size_t>(options.probe_tokens - 1));
  for (TokenId& t : prefix) t = static_cast<TokenId>(id(rng));
  SCD_ASSIGN_OR_RETURN(FrontierPoint full, MeasureSyntheticPoint(producer, consumer, artifact,
                                                                 prefix, WireDtype::kF16, 1));
  const double raw_f16 = static_cast<double>(consumer.config().KvBytesPerToken(2));
  MakeUpKl(full, options.full_kl, raw_f16, &full);
  std::vector<FrontierPoint> points;
  for (WireDtype dtype : options.dtypes) {
    for (double f : options.fractions) {
      if (dtype == WireDtype::kF16 && f == 1) continue;
      SCD_ASSIGN_OR_RETURN(FrontierPoint p, MeasureSyntheticPoint(producer, consumer, artifact,
                                                                  prefix, dtype, f));
      MakeUpKl(full, options.full_kl, raw_f16, &p);
      if (p.bytes_per_token < full.bytes_per_token) points.push_back(std::move(p));
    }
  }
  std::sort(points.begin(), points.end(), [](const FrontierPoint& a, const FrontierPoint& b) {
    return a.bytes_per_token != b.bytes_per_token ? a.bytes_per_token < b.bytes_per_token
                                                  : a.kl < b.kl;
  });
  Frontier frontier;  // ascending bytes, KL falling: the Pareto front, then the full point
  for (FrontierPoint& p : points) {
    const FrontierPoint* last = frontier.points.empty() ? nullptr : &frontier.points.back();
    if (last != nullptr && (p.bytes_per_token <= last->bytes_per_token || p.kl >= last->kl)) {
      continue;
    }
    if (p.kl > full.kl) frontier.points.push_back(std::move(p));
  }
  frontier.points.push_back(full);
  for (size_t i = 0; i < frontier.points.size() && frontier.recommended < 0; ++i) {
    if (frontier.points[i].kl <= 1.25 * full.kl) frontier.recommended = static_cast<int>(i);
  }
  frontier.raw_f16_bytes_per_token = raw_f16;
  frontier.heldout = "synthetic: KL made up (dummy weights, scd-calib synth --frontier)";
  return frontier;
}

}  // namespace scd
