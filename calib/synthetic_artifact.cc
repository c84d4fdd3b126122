#include "calib/synthetic_artifact.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

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

}  // namespace scd
