// ModelConfig: the architecture of a Llama-family decoder, read from a Hugging Face config.json.
// Supports model_type llama, mistral (sliding window) and qwen2 (q/k/v biases). Anything the
// runtime cannot honour is rejected with an error naming the offending field.
// Thread-safety: plain value type.
#ifndef SCD_MODEL_CONFIG_H_
#define SCD_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

enum class RopeScalingType { kNone, kLinear, kLlama3 };

// Rotary position embedding parameters (rotate-half convention, as in HF checkpoints).
struct RopeConfig {
  double theta = 10000.0;
  RopeScalingType scaling = RopeScalingType::kNone;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3

  bool operator==(const RopeConfig& o) const;
  bool operator!=(const RopeConfig& o) const { return !(*this == o); }
  // Stable one-line description, e.g. "theta=10000 scaling=none".
  std::string ToString() const;
};

struct ModelConfig {
  std::string model_type;  // "llama", "mistral" or "qwen2"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2 always; llama attention_bias
  bool o_bias = false;    // llama attention_bias
  bool mlp_bias = false;
  // Keys further back than this many positions are masked (mistral). nullopt: full causal.
  std::optional<int64_t> sliding_window;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";  // as published; informational

  // Parses config.json text. `source` names the file in error messages.
  static absl::StatusOr<ModelConfig> FromJson(const std::string& json_text,
                                              const std::string& source = "config.json");
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t group_size() const { return num_heads / num_kv_heads; }
  // Number of weights, counting a tied embedding once.
  int64_t ParameterCount() const;
  // K and V bytes one token occupies in a native cache across all layers.
  int64_t KvBytesPerToken(int64_t bytes_per_element) const;
  // Multi-line human summary for `scd info`.
  std::string Summary() const;
  // How far two correct runs' logits may differ (a batched step against a lone one, a prefill
  // chunk against a decode step), computing in a dtype of machine epsilon `epsilon`:
  // 50 x epsilon x max(hidden, intermediate) x layers (tests/batching_test.cc derives it). Two
  // greedy runs part only where the top two logits are closer than this (a near-tie).
  double NearTieBound(double epsilon) const;
};

}  // namespace scd

#endif  // SCD_MODEL_CONFIG_H_
