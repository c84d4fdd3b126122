#include "model/gguf_vocab.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd {
namespace {

using json = nlohmann::json;

enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

bool IsByteToken(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

bool UsesByteLevel(const json& j) {
  if (!j.is_object()) return false;
  if (j.value("type", "") == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "normalizers"}) {
    if (j.contains(list) && j[list].is_array()) {
      for (const json& e : j[list]) {
        if (UsesByteLevel(e)) return true;
      }
    }
  }
  return false;
}

// A merge as "a b" whichever way tokenizer.json writes it (a string, or a pair).
absl::StatusOr<std::string> MergeText(const json& m) {
  if (m.is_string() && m.get<std::string>().find(' ') != std::string::npos) {
    return m.get<std::string>();
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>());
  }
  return absl::InvalidArgumentError("a merge is neither \"a b\" nor [\"a\", \"b\"]");
}

// Whether the post-processor's template for one sequence starts with a special token.
bool TemplateAddsBos(const json& post) {
  if (!post.is_object() || post.value("type", "") != "TemplateProcessing") return false;
  const json& single = post.value("single", json::array());
  return single.is_array() && !single.empty() && single[0].contains("SpecialToken");
}

absl::Status FillTokens(const json& model, const json& added, const ModelConfig& config,
                        GgufVocabulary* v) {
  const json& vocab = model.at("vocab");
  int64_t limit = 0;
  const auto take = [&](int64_t id) -> absl::Status {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is negative"));
    limit = std::max(limit, id + 1);
    return absl::OkStatus();
  };
  for (const auto& [token, id] : vocab.items()) SCD_RETURN_IF_ERROR(take(id.get<int64_t>()));
  for (const json& a : added) SCD_RETURN_IF_ERROR(take(a.at("id").get<int64_t>()));
  if (limit > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("the tokenizer has ids up to ", limit - 1,
                                                   " but the model only ", config.vocab_size,
                                                   " rows"));
  }
  v->tokens.assign(config.vocab_size, "");
  v->types.assign(config.vocab_size, kUnused);
  for (int64_t i = 0; i < config.vocab_size; ++i) v->tokens[i] = absl::StrFormat("[PAD%d]", i);
  for (const auto& [token, id] : vocab.items()) {
    const int64_t i = id.get<int64_t>();
    v->tokens[i] = token;
    v->types[i] = IsByteToken(token) ? kByte : kNormal;
  }
  const std::string unk = model.value("unk_token", json()).is_string()
                              ? model["unk_token"].get<std::string>()
                              : std::string();
  for (const json& a : added) {
    const int64_t i = a.at("id").get<int64_t>();
    v->tokens[i] = a.at("content").get<std::string>();
    v->types[i] = a.value("special", false) ? kControl : kUserDefined;
  }
  for (int64_t i = 0; i < config.vocab_size; ++i) {
    if (!unk.empty() && v->tokens[i] == unk) {
      v->types[i] = kUnknown;
      v->unk = i;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void GgufVocabulary::AddTo(GgufWriter* w) const {
  w->SetString("tokenizer.ggml.model", model);
  if (model == "gpt2") w->SetString("tokenizer.ggml.pre", "default");
  w->SetStringArray("tokenizer.ggml.tokens", tokens);
  if (!scores.empty()) w->SetFloat32Array("tokenizer.ggml.scores", scores);
  w->SetInt32Array("tokenizer.ggml.token_type", types);
  if (!merges.empty()) w->SetStringArray("tokenizer.ggml.merges", merges);
  if (bos) w->SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*bos));
  if (eos) w->SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*eos));
  if (unk) w->SetUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*unk));
  w->SetBool("tokenizer.ggml.add_bos_token", add_bos);
  w->SetBool("tokenizer.ggml.add_eos_token", false);
}

absl::StatusOr<GgufVocabulary> VocabularyFromTokenizerJson(const std::string& path,
                                                           const ModelConfig& config) {
  SCD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string tokenizer_config;
  const std::filesystem::path beside =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(beside)) {
    SCD_ASSIGN_OR_RETURN(tokenizer_config, ReadFileToString(beside.string()));
  }
  return VocabularyFromJson(text, tokenizer_config, config, path);
}

absl::StatusOr<GgufVocabulary> VocabularyFromJson(std::string_view tokenizer_json,
                                                  std::string_view tokenizer_config,
                                                  const ModelConfig& config,
                                                  const std::string& path) {
  GgufVocabulary v;
  try {
    const json j = json::parse(tokenizer_json);
    const json& model = j.at("model");
    if (model.value("type", "") != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": model.type '", model.value("type", ""), "' has no GGUF form here (BPE only)"));
    }
    const json added = j.value("added_tokens", json::array());
    SCD_RETURN_IF_ERROR(FillTokens(model, added, config, &v));
    const json merges = model.value("merges", json::array());
    const bool byte_level = UsesByteLevel(j.value("pre_tokenizer", json())) ||
                            UsesByteLevel(j.value("decoder", json()));
    if (model.value("byte_fallback", false) && !byte_level) {
      v.model = "llama";
      v.kind = "SentencePiece-style BPE with byte fallback (scores from merge ranks)";
      const float unranked = -static_cast<float>(merges.size() + 1);
      v.scores.assign(config.vocab_size, unranked);
      for (int64_t i = 0; i < config.vocab_size; ++i) {
        if (v.types[i] != kNormal) v.scores[i] = 0.0f;
      }
      const json& vocab = model.at("vocab");
      for (size_t r = merges.size(); r-- > 0;) {  // lowest rank last: it wins
        SCD_ASSIGN_OR_RETURN(std::string m, MergeText(merges[r]));
        const size_t space = m.find(' ');
        const std::string joined = m.substr(0, space) + m.substr(space + 1);
        if (vocab.contains(joined)) v.scores[vocab[joined].get<int64_t>()] = -static_cast<float>(r);
      }
    } else {
      v.model = "gpt2";
      v.kind = "byte-level BPE (merges)";
      for (const json& m : merges) {
        SCD_ASSIGN_OR_RETURN(std::string text_merge, MergeText(m));
        v.merges.push_back(std::move(text_merge));
      }
    }
    v.add_bos = TemplateAddsBos(j.value("post_processor", json()));
    if (!tokenizer_config.empty()) {
      const json c = json::parse(tokenizer_config);
      if (c.is_object() && c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
        v.add_bos = c["add_bos_token"].get<bool>();
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  v.bos = config.bos_token_id;
  if (!config.eos_token_ids.empty()) v.eos = config.eos_token_ids[0];
  return v;
}

GgufVocabulary PlaceholderVocabulary(const ModelConfig& config) {
  GgufVocabulary v;
  v.model = "llama";
  v.kind = "placeholder (dummy weights: token ids only)";
  const int64_t n = config.vocab_size;
  v.tokens.assign(n, "");
  v.types.assign(n, kNormal);
  v.scores.assign(n, 0.0f);
  v.bos = config.bos_token_id;
  if (!config.eos_token_ids.empty()) v.eos = config.eos_token_ids[0];
  if (v.bos && *v.bos < n) {
    v.tokens[*v.bos] = "<s>";
    v.types[*v.bos] = kControl;
  }
  if (v.eos && *v.eos < n && v.eos != v.bos) {
    v.tokens[*v.eos] = "</s>";
    v.types[*v.eos] = kControl;
  }
  if (n > 0 && v.tokens[0].empty()) {  // SentencePiece's place for the unknown piece
    v.tokens[0] = "<unk>";
    v.types[0] = kUnknown;
    v.unk = 0;
  }
  int next_byte = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!v.tokens[i].empty()) continue;
    if (next_byte < 256) {
      v.tokens[i] = absl::StrFormat("<0x%02X>", next_byte++);
      v.types[i] = kByte;
    } else {
      v.tokens[i] = absl::StrCat("\xe2\x96\x81t", i);  // "▁tN"
      v.scores[i] = -static_cast<float>(i);
    }
  }
  return v;
}

}  // namespace scd
