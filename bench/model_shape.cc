#include "bench/model_shape.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd::bench {

absl::StatusOr<ModelShape> ReadModelShape(const std::string& model) {
  const std::string path = model + "/config.json";
  SCD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(path + " is not a JSON object");
  auto get = [&](const char* key, int64_t otherwise) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : otherwise;
  };
  const int64_t heads = get("num_attention_heads", 0), hidden = get("hidden_size", 0);
  const int64_t head_dim = get("head_dim", heads > 0 ? hidden / heads : 0);
  ModelShape shape;
  shape.vocab_size = get("vocab_size", 0);
  shape.max_position_embeddings = get("max_position_embeddings", 0);
  // K and V of every layer, float32 (the daemons' cache).
  shape.kv_bytes_per_token =
      2 * get("num_hidden_layers", 0) * get("num_key_value_heads", heads) * head_dim * 4;
  if (shape.vocab_size < 4 || shape.max_position_embeddings < 16 || shape.kv_bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no vocab_size, max_position_embeddings or layer shape"));
  }
  return shape;
}

}  // namespace scd::bench
