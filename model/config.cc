#include "model/config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd {
namespace {

using Json = nlohmann::json;

// Reads fields of one JSON object, turning absence and type mismatches into errors that name
// the file and the field.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool Has(const char* name) const { return object_.contains(name) && !object_[name].is_null(); }

  absl::Status Error(const char* name, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, name, ": ", what));
  }

  absl::StatusOr<int64_t> Int(const char* name, std::optional<int64_t> fallback = std::nullopt,
                              int64_t min_value = 1) const {
    if (!Has(name)) {
      if (fallback.has_value()) return *fallback;
      return Error(name, "required field is missing");
    }
    const Json& v = object_[name];
    if (!v.is_number_integer())
      return Error(name, absl::StrCat("expected an integer, got ", v.dump()));
    int64_t value = v.get<int64_t>();
    if (value < min_value) {
      return Error(name, absl::StrCat("must be >= ", min_value, ", got ", value));
    }
    return value;
  }

  absl::StatusOr<double> Number(const char* name, double fallback) const {
    if (!Has(name)) return fallback;
    const Json& v = object_[name];
    if (!v.is_number()) return Error(name, absl::StrCat("expected a number, got ", v.dump()));
    return v.get<double>();
  }

  absl::StatusOr<bool> Bool(const char* name, bool fallback) const {
    if (!Has(name)) return fallback;
    const Json& v = object_[name];
    if (!v.is_boolean()) return Error(name, absl::StrCat("expected true or false, got ", v.dump()));
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(const char* name, std::optional<std::string> fallback) const {
    if (!Has(name)) {
      if (fallback.has_value()) return *fallback;
      return Error(name, "required field is missing");
    }
    const Json& v = object_[name];
    if (!v.is_string()) return Error(name, absl::StrCat("expected a string, got ", v.dump()));
    return v.get<std::string>();
  }

  // An id or a list of ids (eos_token_id may be either).
  absl::StatusOr<std::vector<int64_t>> IdList(const char* name) const {
    std::vector<int64_t> ids;
    if (!Has(name)) return ids;
    const Json& v = object_[name];
    if (v.is_number_integer()) {
      ids.push_back(v.get<int64_t>());
    } else if (v.is_array()) {
      for (const Json& e : v) {
        if (!e.is_number_integer()) return Error(name, "expected integer token ids");
        ids.push_back(e.get<int64_t>());
      }
    } else {
      return Error(name, absl::StrCat("expected a token id or a list of ids, got ", v.dump()));
    }
    return ids;
  }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
};

absl::StatusOr<RopeConfig> ParseRope(const Json& j, const FieldReader& top,
                                     const std::string& source) {
  RopeConfig rope;
  SCD_ASSIGN_OR_RETURN(rope.theta, top.Number("rope_theta", 10000.0));
  if (!(rope.theta > 0)) return top.Error("rope_theta", "must be positive");
  SCD_ASSIGN_OR_RETURN(double partial, top.Number("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return top.Error("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  if (!top.Has("rope_scaling")) return rope;
  const Json& s = j["rope_scaling"];
  if (!s.is_object()) return top.Error("rope_scaling", "expected an object or null");
  FieldReader rs(s, source, "rope_scaling.");
  std::string type_field = rs.Has("rope_type") ? "rope_type" : "type";
  SCD_ASSIGN_OR_RETURN(std::string type, rs.String(type_field.c_str(), std::string("default")));
  if (type == "default") return rope;
  if (type == "linear") {
    rope.scaling = RopeScalingType::kLinear;
    SCD_ASSIGN_OR_RETURN(rope.factor, rs.Number("factor", 0.0));
    if (!(rope.factor > 0)) return rs.Error("factor", "must be a positive number");
    return rope;
  }
  if (type == "llama3") {
    rope.scaling = RopeScalingType::kLlama3;
    SCD_ASSIGN_OR_RETURN(rope.factor, rs.Number("factor", 0.0));
    SCD_ASSIGN_OR_RETURN(rope.low_freq_factor, rs.Number("low_freq_factor", 1.0));
    SCD_ASSIGN_OR_RETURN(rope.high_freq_factor, rs.Number("high_freq_factor", 4.0));
    SCD_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                         rs.Int("original_max_position_embeddings", 8192));
    if (!(rope.factor > 0)) return rs.Error("factor", "must be a positive number");
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return rs.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
    return rope;
  }
  return rs.Error(
      type_field.c_str(),
      absl::StrCat("'", type, "' is not supported (expected default, linear or llama3)"));
}

}  // namespace

bool RopeConfig::operator==(const RopeConfig& o) const {
  return theta == o.theta && scaling == o.scaling && factor == o.factor &&
         low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor &&
         original_max_position_embeddings == o.original_max_position_embeddings;
}

std::string RopeConfig::ToString() const {
  switch (scaling) {
    case RopeScalingType::kNone:
      return absl::StrFormat("theta=%g scaling=none", theta);
    case RopeScalingType::kLinear:
      return absl::StrFormat("theta=%g scaling=linear factor=%g", theta, factor);
    case RopeScalingType::kLlama3:
      return absl::StrFormat(
          "theta=%g scaling=llama3 factor=%g low_freq_factor=%g high_freq_factor=%g "
          "original_max_position_embeddings=%d",
          theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings);
  }
  return "";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& json_text,
                                                  const std::string& source) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  FieldReader f(j, source);
  ModelConfig c;
  SCD_ASSIGN_OR_RETURN(c.model_type, f.String("model_type", std::nullopt));
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2") {
    return f.Error("model_type", absl::StrCat("'", c.model_type,
                                              "' is not supported (expected llama, mistral or "
                                              "qwen2)"));
  }
  SCD_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", std::string("silu")));
  if (act != "silu") {
    return f.Error("hidden_act", absl::StrCat("'", act, "' is not supported (expected silu)"));
  }
  SCD_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  SCD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size"));
  SCD_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers"));
  SCD_ASSIGN_OR_RETURN(c.num_heads, f.Int("num_attention_heads"));
  SCD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_heads));
  SCD_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  SCD_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return f.Error(
        "num_key_value_heads",
        absl::StrCat(c.num_kv_heads, " does not divide num_attention_heads (", c.num_heads, ")"));
  }
  if (!f.Has("head_dim") && c.hidden_size % c.num_heads != 0) {
    return f.Error("num_attention_heads",
                   absl::StrCat(c.num_heads, " does not divide hidden_size (", c.hidden_size,
                                ") and no head_dim is given"));
  }
  SCD_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", c.hidden_size / c.num_heads));
  if (c.head_dim % 2 != 0) return f.Error("head_dim", "must be even for rotary embeddings");
  SCD_ASSIGN_OR_RETURN(c.rms_norm_eps, f.Number("rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps > 0)) return f.Error("rms_norm_eps", "must be positive");
  SCD_ASSIGN_OR_RETURN(c.rope, ParseRope(j, f, source));
  SCD_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  SCD_ASSIGN_OR_RETURN(bool attention_bias, f.Bool("attention_bias", false));
  SCD_ASSIGN_OR_RETURN(c.mlp_bias, f.Bool("mlp_bias", false));
  if (c.model_type == "qwen2") {
    // Qwen2 always carries q/k/v biases (and never an o bias), whatever attention_bias says.
    c.qkv_bias = true;
    c.o_bias = false;
    SCD_ASSIGN_OR_RETURN(bool use_sw, f.Bool("use_sliding_window", false));
    if (use_sw) {
      return f.Error("use_sliding_window", "Qwen2 per-layer sliding windows are not supported");
    }
  } else {
    c.qkv_bias = attention_bias;
    c.o_bias = attention_bias;
  }
  if (c.model_type == "mistral" && f.Has("sliding_window")) {
    SCD_ASSIGN_OR_RETURN(int64_t window, f.Int("sliding_window"));
    c.sliding_window = window;
  }
  if (f.Has("bos_token_id")) {
    SCD_ASSIGN_OR_RETURN(int64_t bos, f.Int("bos_token_id", std::nullopt, 0));
    c.bos_token_id = bos;
  }
  SCD_ASSIGN_OR_RETURN(c.eos_token_ids, f.IdList("eos_token_id"));
  SCD_ASSIGN_OR_RETURN(c.torch_dtype, f.String("torch_dtype", std::string("float32")));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(path, ": cannot open config file (",
                                                           text.status().message(), ")"));
  }
  return FromJson(*text, path);
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t d = hidden_size;
  int64_t per_layer = d * q_dim() + 2 * d * kv_dim() + q_dim() * d  // q, k, v, o
                      + 3 * d * intermediate_size                   // gate, up, down
                      + 2 * d;                                      // two RMSNorm weights
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += d;
  if (mlp_bias) per_layer += 2 * intermediate_size + d;
  int64_t embeddings = vocab_size * d * (tie_word_embeddings ? 1 : 2);
  return embeddings + num_layers * per_layer + d;
}

int64_t ModelConfig::KvBytesPerToken(int64_t bytes_per_element) const {
  return 2 * num_layers * kv_dim() * bytes_per_element;
}

double ModelConfig::NearTieBound(double epsilon) const {
  return 50 * epsilon * static_cast<double>(std::max(hidden_size, intermediate_size)) *
         static_cast<double>(num_layers);
}

std::string ModelConfig::Summary() const {
  std::string s;
  absl::StrAppendFormat(&s, "model_type          %s\n", model_type);
  absl::StrAppendFormat(&s, "layers              %d\n", num_layers);
  absl::StrAppendFormat(&s, "hidden_size         %d\n", hidden_size);
  absl::StrAppendFormat(&s, "intermediate_size   %d\n", intermediate_size);
  absl::StrAppendFormat(&s, "heads / kv_heads    %d / %d (group %d)\n", num_heads, num_kv_heads,
                        group_size());
  absl::StrAppendFormat(&s, "head_dim            %d\n", head_dim);
  absl::StrAppendFormat(&s, "vocab_size          %d\n", vocab_size);
  absl::StrAppendFormat(&s, "max_positions       %d\n", max_position_embeddings);
  absl::StrAppendFormat(&s, "rope                %s\n", rope.ToString());
  absl::StrAppendFormat(&s, "rms_norm_eps        %g\n", rms_norm_eps);
  absl::StrAppendFormat(&s, "sliding_window      %s\n",
                        sliding_window ? absl::StrCat(*sliding_window) : "none");
  absl::StrAppendFormat(&s, "biases              qkv=%d o=%d mlp=%d\n", qkv_bias, o_bias, mlp_bias);
  absl::StrAppendFormat(&s, "tied embeddings     %s\n", tie_word_embeddings ? "yes" : "no");
  absl::StrAppendFormat(&s, "parameters          %d\n", ParameterCount());
  absl::StrAppendFormat(&s, "KV bytes per token  %d (f32), %d (f16/bf16)\n", KvBytesPerToken(4),
                        KvBytesPerToken(2));
  return s;
}

}  // namespace scd
