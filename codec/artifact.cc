#include "codec/artifact.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/fingerprint.h"
#include "model/safetensors.h"

namespace scd {
namespace {

using Json = nlohmann::json;

Json RopeToJson(const RopeConfig& r) {
  const char* scaling = r.scaling == RopeScalingType::kNone     ? "none"
                        : r.scaling == RopeScalingType::kLinear ? "linear"
                                                                : "llama3";
  return {{"theta", r.theta},
          {"scaling", scaling},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

RopeConfig RopeFromJson(const Json& j) {
  RopeConfig r;
  r.theta = j.value("theta", 10000.0);
  const std::string scaling = j.value("scaling", "none");
  r.scaling = scaling == "linear"   ? RopeScalingType::kLinear
              : scaling == "llama3" ? RopeScalingType::kLlama3
                                    : RopeScalingType::kNone;
  r.factor = j.value("factor", 1.0);
  r.low_freq_factor = j.value("low_freq_factor", 1.0);
  r.high_freq_factor = j.value("high_freq_factor", 4.0);
  r.original_max_position_embeddings = j.value("original_max_position_embeddings", int64_t{8192});
  return r;
}

Json IdentityToJson(const ModelIdentity& m) {
  return {{"name", m.name},     {"fingerprint", m.fingerprint}, {"rope", RopeToJson(m.rope)},
          {"layers", m.layers}, {"kv_heads", m.kv_heads},       {"head_dim", m.head_dim},
          {"hidden", m.hidden}};
}

ModelIdentity IdentityFromJson(const Json& j) {
  ModelIdentity m;
  m.name = j.value("name", "");
  m.fingerprint = j.value("fingerprint", "");
  if (j.contains("rope")) m.rope = RopeFromJson(j["rope"]);
  m.layers = j.value("layers", int64_t{0});
  m.kv_heads = j.value("kv_heads", int64_t{0});
  m.head_dim = j.value("head_dim", int64_t{0});
  m.hidden = j.value("hidden", int64_t{0});
  return m;
}

Json ParseOrEmpty(const std::string& text) {
  if (text.empty()) return Json::object();
  Json j = Json::parse(text, nullptr, false);
  return j.is_discarded() ? Json::object() : j;
}

std::string Prefix(int layer, const char* part) { return absl::StrCat("layer.", layer, ".", part); }

void AddTranslator(std::map<std::string, at::Tensor>* out, const std::string& prefix,
                   const ReuseTranslator& t) {
  (*out)[prefix + ".mu_a"] = t.mu_a();
  (*out)[prefix + ".mu_b"] = t.mu_b();
  (*out)[prefix + ".w_enc"] = t.w_enc();
  (*out)[prefix + ".w_dec"] = t.w_dec();
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": invalid SCD artifact: ", what));
}

}  // namespace

std::string LayerRouteName(LayerRoute route) {
  return route == LayerRoute::kPatch ? "patch" : "reuse";
}

absl::StatusOr<ModelIdentity> ModelIdentity::Of(const LlamaModel& model) {
  ModelIdentity m;
  m.name =
      model.source().empty() ? "dummy" : std::filesystem::path(model.source()).filename().string();
  SCD_ASSIGN_OR_RETURN(m.fingerprint, FingerprintModel(model));
  const ModelConfig& c = model.config();
  m.rope = c.rope;
  m.layers = c.num_layers;
  m.kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.hidden = c.hidden_size;
  return m;
}

std::vector<int> Artifact::PatchLayers() const {
  std::vector<int> out;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].route == LayerRoute::kPatch) out.push_back(static_cast<int>(l));
  }
  return out;
}

std::vector<int> Artifact::RecomputeLayers() const {
  Json policy = ParseOrEmpty(policy_json);
  std::vector<int> out;
  if (policy.contains("recompute_layers") && policy["recompute_layers"].is_array()) {
    for (const Json& v : policy["recompute_layers"]) {
      if (v.is_number_integer()) out.push_back(v.get<int>());
    }
  }
  return out;
}

absl::Status Artifact::Save(const std::string& path) const {
  std::map<std::string, at::Tensor> tensors;
  Json layer_meta = Json::array();
  for (size_t l = 0; l < layers.size(); ++l) {
    const ArtifactLayer& layer = layers[l];
    const int li = static_cast<int>(l);
    AddTranslator(&tensors, Prefix(li, "key"), layer.key);
    AddTranslator(&tensors, Prefix(li, "value"), layer.value);
    Json meta = {{"route", LayerRouteName(layer.route)},
                 {"rank_k", layer.key.rank()},
                 {"rank_v", layer.value.rank()},
                 {"per_head", layer.key.per_head()}};
    if (layer.patch) {
      AddTranslator(&tensors, Prefix(li, "patch.basis"), layer.patch->basis());
      tensors[Prefix(li, "patch.z_scale")] = layer.patch->z_scale();
      for (size_t i = 0; i < layer.patch->weights().size(); ++i) {
        tensors[absl::StrCat(Prefix(li, "patch.mlp."), i, ".weight")] = layer.patch->weights()[i];
        tensors[absl::StrCat(Prefix(li, "patch.mlp."), i, ".bias")] = layer.patch->biases()[i];
      }
      meta["rank_h"] = layer.patch->rank();
      meta["aligner_layers"] = layer.patch->weights().size();
    }
    layer_meta.push_back(meta);
  }
  SafetensorsWriter writer;
  Sha256 checksum;
  for (const auto& [name, t] : tensors) {  // sorted, the order Load() hashes in
    at::Tensor c = t.to(at::kCPU, at::kFloat).contiguous();
    SCD_RETURN_IF_ERROR(writer.Add(name, c));
    checksum.Update(name);
    checksum.Update(c.data_ptr(), c.numel() * sizeof(float));
  }
  writer.SetMetadata("scd.format_version", std::to_string(kArtifactFormatVersion));
  writer.SetMetadata("scd.producer", IdentityToJson(producer).dump());
  writer.SetMetadata("scd.consumer", IdentityToJson(consumer).dump());
  writer.SetMetadata("scd.layers", layer_meta.dump());
  writer.SetMetadata("scd.fit_method", fit_method);
  writer.SetMetadata("scd.calibration", ParseOrEmpty(calibration_json).dump());
  writer.SetMetadata("scd.policy", ParseOrEmpty(policy_json).dump());
  writer.SetMetadata("scd.fidelity", ParseOrEmpty(fidelity_json).dump());
  writer.SetMetadata("scd.tensors_sha256", checksum.HexDigest());
  return writer.Write(path);
}

absl::StatusOr<Artifact> Artifact::Load(const std::string& path) {
  SCD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  const auto& meta = file->metadata();
  auto get = [&](const char* key) -> const std::string* {
    auto it = meta.find(key);
    return it == meta.end() ? nullptr : &it->second;
  };
  const std::string* version = get("scd.format_version");
  if (version == nullptr) return Corrupt(path, "no scd.format_version (not an SCD artifact?)");
  if (*version != std::to_string(kArtifactFormatVersion)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": artifact format version ", *version,
                                                      " is not supported (expected ",
                                                      kArtifactFormatVersion, ")"));
  }
  for (const char* key : {"scd.producer", "scd.consumer", "scd.layers", "scd.tensors_sha256"}) {
    if (get(key) == nullptr) return Corrupt(path, absl::StrCat("metadata ", key, " is missing"));
  }
  Sha256 checksum;
  for (const std::string& name : file->names()) {
    const TensorEntry* e = file->Find(name);
    if (e->dtype != StDtype::kF32) return Corrupt(path, absl::StrCat(name, " is not F32"));
    checksum.Update(name);
    checksum.Update(e->data, static_cast<size_t>(e->size_bytes));
  }
  if (checksum.HexDigest() != *get("scd.tensors_sha256")) {
    return Corrupt(path, "tensor data does not match its checksum (corrupted file)");
  }
  Json producer = Json::parse(*get("scd.producer"), nullptr, false);
  Json consumer = Json::parse(*get("scd.consumer"), nullptr, false);
  Json layers = Json::parse(*get("scd.layers"), nullptr, false);
  if (producer.is_discarded() || consumer.is_discarded() || !layers.is_array()) {
    return Corrupt(path, "metadata is not valid JSON");
  }
  Artifact a;
  a.producer = IdentityFromJson(producer);
  a.consumer = IdentityFromJson(consumer);
  if (const std::string* m = get("scd.fit_method")) a.fit_method = *m;
  if (const std::string* m = get("scd.calibration")) a.calibration_json = *m;
  if (const std::string* m = get("scd.policy")) a.policy_json = *m;
  if (const std::string* m = get("scd.fidelity")) a.fidelity_json = *m;
  if (static_cast<int64_t>(layers.size()) != a.consumer.layers) {
    return Corrupt(path, absl::StrCat("describes ", layers.size(), " layers but the consumer has ",
                                      a.consumer.layers));
  }
  auto tensor = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    if (file->Find(name) == nullptr)
      return Corrupt(path, absl::StrCat("tensor ", name, " is missing"));
    return file->Load(name, at::kFloat);
  };
  auto translator = [&](const std::string& prefix) -> absl::StatusOr<ReuseTranslator> {
    SCD_ASSIGN_OR_RETURN(at::Tensor mu_a, tensor(prefix + ".mu_a"));
    SCD_ASSIGN_OR_RETURN(at::Tensor mu_b, tensor(prefix + ".mu_b"));
    SCD_ASSIGN_OR_RETURN(at::Tensor w_enc, tensor(prefix + ".w_enc"));
    SCD_ASSIGN_OR_RETURN(at::Tensor w_dec, tensor(prefix + ".w_dec"));
    auto t = ReuseTranslator::FromTensors(mu_a, mu_b, w_enc, w_dec);
    if (!t.ok()) return Corrupt(path, absl::StrCat(prefix, ": ", t.status().message()));
    return t;
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const int li = static_cast<int>(l);
    const Json& lm = layers[l];
    ArtifactLayer layer;
    const std::string route = lm.is_object() ? lm.value("route", "") : "";
    if (route != "reuse" && route != "patch") {
      return Corrupt(path, absl::StrCat("layer ", l, " has route '", route, "'"));
    }
    layer.route = route == "patch" ? LayerRoute::kPatch : LayerRoute::kReuse;
    SCD_ASSIGN_OR_RETURN(layer.key, translator(Prefix(li, "key")));
    SCD_ASSIGN_OR_RETURN(layer.value, translator(Prefix(li, "value")));
    if (layer.key.dim_in() != a.producer.head_dim || layer.key.dim_out() != a.consumer.head_dim) {
      return Corrupt(path, absl::StrCat("layer ", l, " key translator does not map head_dim ",
                                        a.producer.head_dim, " -> ", a.consumer.head_dim));
    }
    if (lm.contains("rank_h")) {
      SCD_ASSIGN_OR_RETURN(ReuseTranslator basis, translator(Prefix(li, "patch.basis")));
      SCD_ASSIGN_OR_RETURN(at::Tensor z_scale, tensor(Prefix(li, "patch.z_scale")));
      std::vector<at::Tensor> weights, biases;
      const int64_t n = lm.value("aligner_layers", int64_t{0});
      for (int64_t i = 0; i < n; ++i) {
        SCD_ASSIGN_OR_RETURN(at::Tensor w,
                             tensor(absl::StrCat(Prefix(li, "patch.mlp."), i, ".weight")));
        SCD_ASSIGN_OR_RETURN(at::Tensor b,
                             tensor(absl::StrCat(Prefix(li, "patch.mlp."), i, ".bias")));
        weights.push_back(w);
        biases.push_back(b);
      }
      auto aligner = PatchAligner::Create(std::move(basis), z_scale, weights, biases);
      if (!aligner.ok())
        return Corrupt(path, absl::StrCat("layer ", l, ": ", aligner.status().message()));
      layer.patch = std::move(*aligner);
    }
    if (layer.route == LayerRoute::kPatch && !layer.patch) {
      return Corrupt(path, absl::StrCat("patch layer ", l, " has no aligner"));
    }
    a.layers.push_back(std::move(layer));
  }
  return a;
}

absl::Status Artifact::CheckModels(const LlamaModel& producer_model,
                                   const LlamaModel& consumer_model) const {
  SCD_ASSIGN_OR_RETURN(std::string p, FingerprintModel(producer_model));
  SCD_ASSIGN_OR_RETURN(std::string c, FingerprintModel(consumer_model));
  auto mismatch = [](const char* side, const ModelIdentity& want, const std::string& got,
                     const std::string& source) {
    return absl::FailedPreconditionError(absl::StrCat(
        "artifact was fitted for ", side, " '", want.name, "' (fingerprint ",
        want.fingerprint.substr(0, 16), "...) but ", source.empty() ? "the model" : source,
        " has fingerprint ", got.substr(0, 16), "...: refit with scd-calib fit"));
  };
  if (p != producer.fingerprint) {
    return mismatch("producer", producer, p, producer_model.source());
  }
  if (c != consumer.fingerprint) {
    return mismatch("consumer", consumer, c, consumer_model.source());
  }
  return absl::OkStatus();
}

absl::StatusOr<Artifact> Artifact::LoadFor(const std::string& path, const LlamaModel& producer,
                                           const LlamaModel& consumer) {
  SCD_ASSIGN_OR_RETURN(Artifact a, Load(path));
  SCD_RETURN_IF_ERROR(a.CheckModels(producer, consumer));
  return a;
}

}  // namespace scd
