#include "codec/artifact.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/exception_guard.h"
#include "base/file_util.h"
#include "base/fuzzing.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "codec/fingerprint.h"
#include "model/runtime.h"
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
          {"hidden", m.hidden}, {"precision", m.precision}};
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
  m.precision = j.value("precision", "f32");  // artifacts from before precisions: float32
  return m;
}

Json ParseOrEmpty(const std::string& text) {
  if (text.empty()) return Json::object();
  Json j = Json::parse(text, nullptr, false);
  return j.is_discarded() ? Json::object() : j;
}

// What Save writes where no map is folded (kArtifactFormatVersion needs a reader of folded maps).
constexpr int kUnfoldedFormatVersion = 2;

std::string Prefix(int layer, const char* part) { return absl::StrCat("layer.", layer, ".", part); }

void AddTranslator(std::map<std::string, at::Tensor>* out, const std::string& prefix,
                   const ReuseTranslator& t) {
  (*out)[prefix + ".mu_a"] = t.mu_a();
  (*out)[prefix + ".mu_b"] = t.mu_b();
  (*out)[prefix + ".w_enc"] = t.w_enc();
  (*out)[prefix + ".w_dec"] = t.w_dec();
  if (t.folded()) {  // head indices are small integers: exact in float32
    std::vector<float> heads(t.column_heads().begin(), t.column_heads().end());
    (*out)[prefix + ".column_heads"] =
        at::tensor(heads, at::TensorOptions().dtype(at::kFloat)).clone();
  }
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": invalid SCD artifact: ", what));
}

}  // namespace

std::string LayerRouteName(LayerRoute route) {
  return route == LayerRoute::kPatch ? "patch" : "reuse";
}

absl::StatusOr<ModelIdentity> ModelIdentity::Of(const LlamaModel& model) {
  return GuardExceptions("ModelIdentity::Of", [&]() -> absl::StatusOr<ModelIdentity> {
    ModelIdentity m;
    m.name = model.source().empty() ? "dummy"
                                    : std::filesystem::path(model.source()).filename().string();
    SCD_ASSIGN_OR_RETURN(m.fingerprint, FingerprintModel(model));
    const ModelConfig& c = model.config();
    m.rope = c.rope;
    m.layers = c.num_layers;
    m.kv_heads = c.num_kv_heads;
    m.head_dim = c.head_dim;
    m.hidden = c.hidden_size;
    m.precision = PrecisionName(model.precision());
    return m;
  });
}

std::vector<int> Artifact::PatchLayers() const {
  std::vector<int> out;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].route == LayerRoute::kPatch) out.push_back(static_cast<int>(l));
  }
  return out;
}

RankLimits Artifact::FrontierLimits() const {
  RankLimits limits;
  for (const ArtifactLayer& layer : layers) {
    const bool patch = layer.route == LayerRoute::kPatch;
    limits.max_k.push_back(patch ? 0 : layer.key.rank());
    limits.max_v.push_back(patch ? 0 : layer.value.rank());
    limits.max_h.push_back(patch ? layer.patch->rank() : 0);
  }
  return limits;
}

absl::Status Artifact::Save(const std::string& path) const {
  return GuardExceptions("Artifact::Save", [&]() -> absl::Status {
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
    // Version 3 only where a reader needs it (folded maps), so older builds read the rest.
    const bool folded = std::any_of(layers.begin(), layers.end(), [](const ArtifactLayer& l) {
      return l.key.folded() || l.value.folded();
    });
    writer.SetMetadata("scd.format_version",
                       std::to_string(folded ? kArtifactFormatVersion : kUnfoldedFormatVersion));
    writer.SetMetadata("scd.producer", IdentityToJson(producer).dump());
    writer.SetMetadata("scd.consumer", IdentityToJson(consumer).dump());
    writer.SetMetadata("scd.layers", layer_meta.dump());
    writer.SetMetadata("scd.fit_method", fit_method);
    writer.SetMetadata("scd.calibration", ParseOrEmpty(calibration_json).dump());
    writer.SetMetadata("scd.policy", ParseOrEmpty(policy_json).dump());
    writer.SetMetadata("scd.fidelity", ParseOrEmpty(fidelity_json).dump());
    if (!measured.empty()) {
      Json list = Json::array();
      for (const PrecisionMeasurement& m : measured) {
        list.push_back({{"precision", m.precision}, {"kl", m.kl},
                        {"bytes_per_token", m.bytes_per_token}, {"ppl_ratio", m.ppl_ratio},
                        {"windows", m.windows}, {"data", m.data}});
      }
      writer.SetMetadata("scd.precision_fidelity", list.dump());
    }
    writer.SetMetadata("scd.recompute_layers", Json(recompute_layers).dump());
    if (!frontier.empty()) {
      SCD_RETURN_IF_ERROR(frontier.CheckAgainst(FrontierLimits()));
      writer.SetMetadata("scd.frontier", frontier.ToJson());
    }
    writer.SetMetadata("scd.tensors_sha256", checksum.HexDigest());
    return writer.Write(path);
  });
}

namespace {

// Reads one artifact file: every accessor refuses what is missing or malformed with a DataLoss
// status naming the file.
class ArtifactReader {
 public:
  ArtifactReader(std::string path, std::unique_ptr<SafetensorsFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}

  const std::string* Meta(const char* key) const {
    auto it = file_->metadata().find(key);
    return it == file_->metadata().end() ? nullptr : &it->second;
  }

  // The format version (1 to 3; others are refused) after checking required keys and the
  // checksum of every tensor byte.
  absl::StatusOr<int> CheckHeader() const {
    const std::string* version = Meta("scd.format_version");
    if (version == nullptr) return Corrupt(path_, "no scd.format_version (not an SCD artifact?)");
    int v = 0;  // exact text only: "03" or "3x" are no version
    for (int known = 1; known <= kArtifactFormatVersion; ++known) {
      if (*version == std::to_string(known)) v = known;
    }
    if (v == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": artifact format version ", *version,
                       " is not supported (this build reads 1 to ", kArtifactFormatVersion, ")"));
    }
    for (const char* key : {"scd.producer", "scd.consumer", "scd.layers", "scd.tensors_sha256"}) {
      if (Meta(key) == nullptr)
        return Corrupt(path_, absl::StrCat("metadata ", key, " is missing"));
    }
    Sha256 checksum;
    for (const std::string& name : file_->names()) {
      const TensorEntry* e = file_->Find(name);
      if (e->dtype != StDtype::kF32) return Corrupt(path_, absl::StrCat(name, " is not F32"));
      checksum.Update(name);
      checksum.Update(e->data, static_cast<size_t>(e->size_bytes));
    }
    if (kChecksumsChecked && checksum.HexDigest() != *Meta("scd.tensors_sha256")) {
      return Corrupt(path_, "tensor data does not match its checksum (corrupted file)");
    }
    return v;
  }

  absl::StatusOr<Json> MetaJson(const char* key) const {
    const std::string* text = Meta(key);
    Json j = text == nullptr ? Json() : Json::parse(*text, nullptr, false);
    if (j.is_discarded() || j.is_null()) {
      return Corrupt(path_, absl::StrCat("metadata ", key, " is not valid JSON"));
    }
    return j;
  }

  absl::StatusOr<at::Tensor> Tensor(const std::string& name) const {
    if (file_->Find(name) == nullptr) {
      return Corrupt(path_, absl::StrCat("tensor ", name, " is missing"));
    }
    return file_->Load(name, at::kFloat);
  }

  // `heads`: the kv heads a folded map (one with `.column_heads`) spans; 0 where none may.
  absl::StatusOr<ReuseTranslator> Translator(const std::string& prefix, int64_t heads = 0) const {
    SCD_ASSIGN_OR_RETURN(at::Tensor mu_a, Tensor(prefix + ".mu_a"));
    SCD_ASSIGN_OR_RETURN(at::Tensor mu_b, Tensor(prefix + ".mu_b"));
    SCD_ASSIGN_OR_RETURN(at::Tensor w_enc, Tensor(prefix + ".w_enc"));
    SCD_ASSIGN_OR_RETURN(at::Tensor w_dec, Tensor(prefix + ".w_dec"));
    std::vector<int> column_heads;
    if (file_->Find(prefix + ".column_heads") != nullptr) {
      if (heads < 2) return Corrupt(path_, absl::StrCat(prefix, " is folded where none may be"));
      SCD_ASSIGN_OR_RETURN(at::Tensor c, Tensor(prefix + ".column_heads"));
      c = c.contiguous().view(-1);
      const float* values = c.data_ptr<float>();
      for (int64_t i = 0; i < c.numel(); ++i) {
        const float h = values[i];
        if (h != std::floor(h) || h < 0 || h >= static_cast<float>(heads)) {
          return Corrupt(path_, absl::StrCat(prefix, ".column_heads[", i, "] is ", h));
        }
        column_heads.push_back(static_cast<int>(h));
      }
      if (column_heads.empty()) return Corrupt(path_, absl::StrCat(prefix, " names no columns"));
    }
    auto t = ReuseTranslator::FromTensors(mu_a, mu_b, w_enc, w_dec, std::move(column_heads), heads);
    if (!t.ok()) return Corrupt(path_, absl::StrCat(prefix, ": ", t.status().message()));
    return t;
  }

  absl::StatusOr<PatchAligner> Aligner(int l, const Json& meta) const {
    SCD_ASSIGN_OR_RETURN(ReuseTranslator basis, Translator(Prefix(l, "patch.basis")));
    SCD_ASSIGN_OR_RETURN(at::Tensor z_scale, Tensor(Prefix(l, "patch.z_scale")));
    std::vector<at::Tensor> weights, biases;
    const int64_t n = meta.value("aligner_layers", int64_t{0});
    for (int64_t i = 0; i < n; ++i) {
      const std::string mlp = absl::StrCat(Prefix(l, "patch.mlp."), i);
      SCD_ASSIGN_OR_RETURN(at::Tensor w, Tensor(mlp + ".weight"));
      SCD_ASSIGN_OR_RETURN(at::Tensor b, Tensor(mlp + ".bias"));
      weights.push_back(w);
      biases.push_back(b);
    }
    auto aligner = PatchAligner::Create(std::move(basis), z_scale, weights, biases);
    if (!aligner.ok()) {
      return Corrupt(path_, absl::StrCat("layer ", l, ": ", aligner.status().message()));
    }
    return aligner;
  }

  absl::StatusOr<ArtifactLayer> Layer(int l, const Json& meta, const Artifact& a) const {
    ArtifactLayer layer;
    const std::string route = meta.is_object() ? meta.value("route", "") : "";
    if (route != "reuse" && route != "patch") {
      return Corrupt(path_, absl::StrCat("layer ", l, " has route '", route, "'"));
    }
    layer.route = route == "patch" ? LayerRoute::kPatch : LayerRoute::kReuse;
    const int64_t heads = a.producer.kv_heads;
    SCD_ASSIGN_OR_RETURN(layer.key, Translator(Prefix(l, "key"), heads));
    SCD_ASSIGN_OR_RETURN(layer.value, Translator(Prefix(l, "value"), heads));
    for (const ReuseTranslator* t : {&layer.key, &layer.value}) {
      const int64_t f = t->folded() ? heads : 1;  // a folded map spans every head's dims
      if (t->dim_in() != f * a.producer.head_dim || t->dim_out() != f * a.consumer.head_dim) {
        return Corrupt(path_, absl::StrCat("layer ", l, " ", t == &layer.key ? "key" : "value",
                                           " translator does not map head_dim ",
                                           a.producer.head_dim, " -> ", a.consumer.head_dim));
      }
    }
    if (meta.contains("rank_h")) {
      SCD_ASSIGN_OR_RETURN(layer.patch, Aligner(l, meta));
    }
    if (layer.route == LayerRoute::kPatch && !layer.patch) {
      return Corrupt(path_, absl::StrCat("patch layer ", l, " has no aligner"));
    }
    return layer;
  }

  // Version 2 stores the recompute plan as a typed field; version 1 kept it inside the policy
  // document.
  absl::StatusOr<std::vector<int>> RecomputeLayers(int version, int layers) const {
    Json list;
    if (version >= 2) {
      SCD_ASSIGN_OR_RETURN(list, MetaJson("scd.recompute_layers"));
    } else {
      absl::StatusOr<Json> policy = MetaJson("scd.policy");
      if (policy.ok() && policy->contains("recompute_layers")) list = (*policy)["recompute_layers"];
    }
    std::vector<int> out;
    if (list.is_null()) return out;
    if (!list.is_array()) return Corrupt(path_, "recompute layers are not a list");
    for (const Json& v : list) {
      if (!v.is_number_integer() || v.get<int>() < 0 || v.get<int>() >= layers) {
        return Corrupt(path_, absl::StrCat("recompute layer ", v.dump(), " is not a layer index"));
      }
      out.push_back(v.get<int>());
    }
    return out;
  }

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
};

}  // namespace

absl::StatusOr<Artifact> Artifact::Load(const std::string& path) {
  return GuardExceptions("Artifact::Load", [&]() -> absl::StatusOr<Artifact> {
    SCD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    const ArtifactReader reader(path, std::move(file));
    SCD_ASSIGN_OR_RETURN(const int version, reader.CheckHeader());
    SCD_ASSIGN_OR_RETURN(Json producer, reader.MetaJson("scd.producer"));
    SCD_ASSIGN_OR_RETURN(Json consumer, reader.MetaJson("scd.consumer"));
    SCD_ASSIGN_OR_RETURN(Json layers, reader.MetaJson("scd.layers"));
    if (!layers.is_array()) return Corrupt(path, "metadata scd.layers is not a list");
    Artifact a;
    a.producer = IdentityFromJson(producer);
    a.consumer = IdentityFromJson(consumer);
    if (const std::string* m = reader.Meta("scd.fit_method")) a.fit_method = *m;
    if (const std::string* m = reader.Meta("scd.calibration")) a.calibration_json = *m;
    if (const std::string* m = reader.Meta("scd.policy")) a.policy_json = *m;
    if (const std::string* m = reader.Meta("scd.fidelity")) a.fidelity_json = *m;
    if (reader.Meta("scd.precision_fidelity") != nullptr) {
      SCD_ASSIGN_OR_RETURN(Json list, reader.MetaJson("scd.precision_fidelity"));
      if (!list.is_array()) return Corrupt(path, "metadata scd.precision_fidelity is not a list");
      for (const Json& m : list) {
        a.measured.push_back({m.at("precision").get<std::string>(), m.at("kl").get<double>(),
                              m.value("bytes_per_token", 0.0), m.value("ppl_ratio", 0.0),
                              m.value("windows", int64_t{0}), m.value("data", "")});
      }
    }
    if (static_cast<int64_t>(layers.size()) != a.consumer.layers) {
      return Corrupt(path, absl::StrCat("describes ", layers.size(),
                                        " layers but the consumer has ", a.consumer.layers));
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      SCD_ASSIGN_OR_RETURN(ArtifactLayer layer, reader.Layer(static_cast<int>(l), layers[l], a));
      a.layers.push_back(std::move(layer));
    }
    SCD_ASSIGN_OR_RETURN(a.recompute_layers,
                         reader.RecomputeLayers(version, static_cast<int>(layers.size())));
    if (const std::string* m = reader.Meta("scd.frontier")) {
      absl::StatusOr<Frontier> frontier = Frontier::FromJson(*m, a.FrontierLimits());
      if (!frontier.ok()) return Corrupt(path, std::string(frontier.status().message()));
      a.frontier = *std::move(frontier);
    }
    return a;
  });
}

absl::Status Artifact::CheckModels(const LlamaModel& producer_model,
                                   const LlamaModel& consumer_model) const {
  return GuardExceptions("Artifact::CheckModels", [&]() -> absl::Status {
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
  });
}

absl::StatusOr<Artifact> Artifact::LoadFor(const std::string& path, const LlamaModel& producer,
                                           const LlamaModel& consumer) {
  SCD_ASSIGN_OR_RETURN(Artifact a, Load(path));
  SCD_RETURN_IF_ERROR(a.CheckModels(producer, consumer));
  return a;
}

const PrecisionMeasurement* Artifact::MeasuredAt(const std::string& precision) const {
  for (const PrecisionMeasurement& m : measured) {
    if (m.precision == precision) return &m;
  }
  return nullptr;
}

void Artifact::Record(PrecisionMeasurement m) {
  for (PrecisionMeasurement& old : measured) {
    if (old.precision == m.precision) {
      old = std::move(m);
      return;
    }
  }
  measured.push_back(std::move(m));
}

absl::Status CheckConsumerPrecision(const Artifact& artifact, const std::string& consumer_precision) {
  if (artifact.consumer.precision == consumer_precision ||
      artifact.MeasuredAt(consumer_precision) != nullptr) {
    return absl::OkStatus();
  }
  std::string measured = "no fidelity was recorded at fit time";
  const Json fidelity = ParseOrEmpty(artifact.fidelity_json);
  if (fidelity.contains("scd") && fidelity["scd"].is_object() &&
      fidelity["scd"].value("kl", Json()).is_number()) {
    measured = absl::StrFormat("scd measured at fit time (%s consumer): KL %.4g nats at %.0f bytes "
                               "per token",
                               artifact.consumer.precision, fidelity["scd"]["kl"].get<double>(),
                               fidelity["scd"].value("bytes_per_token", 0.0));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "artifact for consumer '", artifact.consumer.name, "' was fitted at ",
      artifact.consumer.precision, " weights, this node serves ", consumer_precision, " (", measured,
      "; not measured at ", consumer_precision, "): measure it with scd-calib eval --consumer-dtype ",
      consumer_precision, " --record FILE, or fit one with scd-calib fit --consumer-dtype ",
      consumer_precision));
}

absl::StatusOr<std::string> ArtifactFileId(const std::string& path) {
  SCD_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return Sha256Hex(bytes).substr(0, 16);
}

}  // namespace scd
