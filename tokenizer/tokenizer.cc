#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "tokenizer/added.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace scd {

using tokenizer_internal::AddedSplit;
using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::BpeModel;
using tokenizer_internal::Concat;
using tokenizer_internal::Decoder;
using tokenizer_internal::GetString;
using tokenizer_internal::GetType;
using tokenizer_internal::Json;
using tokenizer_internal::JsonError;
using tokenizer_internal::JsonPath;
using tokenizer_internal::Normalizer;
using tokenizer_internal::PreToken;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::RequiredField;

namespace {

// What the post-processor does to a single sequence: the ids of the template's pieces in order,
// where one empty `ids` with `is_sequence` stands for the encoded text.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<TokenId> ids;
};
using Template = std::vector<TemplatePiece>;

// Substitutes `inner` for the sequence slot of `outer`.
Template Compose(const Template& outer, const Template& inner) {
  Template out;
  for (const TemplatePiece& piece : outer) {
    if (piece.is_sequence) {
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      out.push_back(piece);
    }
  }
  return out;
}

absl::StatusOr<TokenId> ParseTokenAndId(const Json& json, std::string_view path) {
  // BertProcessing / RobertaProcessing store ["[CLS]", 101].
  if (!json.is_array() || json.size() != 2 || !json[0].is_string() ||
      !json[1].is_number_integer()) {
    return JsonError(path, "must be a [token, id] pair");
  }
  return static_cast<TokenId>(json[1].get<int64_t>());
}

absl::StatusOr<Template> ParsePostProcessor(const Json& json, std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const std::string type, GetType(json, path));
  if (type == "TemplateProcessing") {
    SCD_ASSIGN_OR_RETURN(const Json* single, RequiredField(json, path, "single"));
    SCD_ASSIGN_OR_RETURN(const Json* specials, RequiredField(json, path, "special_tokens"));
    const std::string single_path = JsonPath(path, "single");
    if (!single->is_array()) return JsonError(single_path, "must be an array");
    Template out;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& item = (*single)[i];
      const std::string item_path = Concat(single_path, "[", i, "]");
      if (item.is_object() && item.contains("Sequence")) {
        SCD_ASSIGN_OR_RETURN(const std::string id, GetString(item["Sequence"], item_path, "id"));
        if (id != "A") {
          return JsonError(item_path,
                           Concat("sequence \"", id, "\" is not supported in a single template"));
        }
        out.push_back({true, {}});
      } else if (item.is_object() && item.contains("SpecialToken")) {
        SCD_ASSIGN_OR_RETURN(const std::string id,
                             GetString(item["SpecialToken"], item_path, "id"));
        const std::string special_path = JsonPath(path, "special_tokens");
        if (!specials->is_object() || !specials->contains(id)) {
          return JsonError(special_path, Concat("has no entry for \"", id, "\""));
        }
        SCD_ASSIGN_OR_RETURN(const Json* ids,
                             RequiredField((*specials)[id], JsonPath(special_path, id), "ids"));
        TemplatePiece piece;
        if (!ids->is_array()) return JsonError(JsonPath(special_path, id), "ids must be an array");
        for (const Json& value : *ids) {
          if (!value.is_number_integer()) {
            return JsonError(JsonPath(special_path, id), "ids must be integers");
          }
          piece.ids.push_back(static_cast<TokenId>(value.get<int64_t>()));
        }
        out.push_back(std::move(piece));
      } else {
        return JsonError(item_path, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    return out;
  }
  if (type == "ByteLevel") return Template{{true, {}}};  // only adjusts offsets
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    SCD_ASSIGN_OR_RETURN(const Json* cls, RequiredField(json, path, "cls"));
    SCD_ASSIGN_OR_RETURN(const Json* sep, RequiredField(json, path, "sep"));
    SCD_ASSIGN_OR_RETURN(const TokenId cls_id, ParseTokenAndId(*cls, JsonPath(path, "cls")));
    SCD_ASSIGN_OR_RETURN(const TokenId sep_id, ParseTokenAndId(*sep, JsonPath(path, "sep")));
    return Template{{false, {cls_id}}, {true, {}}, {false, {sep_id}}};
  }
  if (type == "Sequence") {
    SCD_ASSIGN_OR_RETURN(const Json* list, RequiredField(json, path, "processors"));
    const std::string list_path = JsonPath(path, "processors");
    if (!list->is_array()) return JsonError(list_path, "must be an array");
    Template out{{true, {}}};
    for (size_t i = 0; i < list->size(); ++i) {
      SCD_ASSIGN_OR_RETURN(Template step,
                           ParsePostProcessor((*list)[i], Concat(list_path, "[", i, "]")));
      out = Compose(step, out);
    }
    return out;
  }
  return JsonError(JsonPath(path, "type"), Concat("\"", type, "\" is not supported"));
}

// Null or an object: the optional pipeline components.
absl::StatusOr<const Json*> OptionalComponent(const Json& root, std::string_view key) {
  auto it = root.find(std::string(key));
  if (it == root.end() || it->is_null()) return nullptr;
  if (!it->is_object()) return JsonError(key, "must be an object or null");
  return &*it;
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<AddedVocabulary> added;
  Template post_template{{true, {}}};
  std::unique_ptr<Decoder> decoder;  // may be null: tokens are joined with spaces
  std::string fingerprint;

  const std::string* TokenString(TokenId id) const {
    const std::string* token = added->IdToToken(id);
    return token != nullptr ? token : model->IdToToken(id);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        Concat("cannot read tokenizer file: ", contents.status().message()));
  }
  auto tokenizer = FromJson(*contents);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        Concat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    return absl::InvalidArgumentError(Concat("tokenizer.json: malformed JSON: ", e.what()));
  }
  if (!root.is_object()) return JsonError("(root)", "must be an object");
  for (const char* key : {"truncation", "padding"}) {
    auto it = root.find(key);
    if (it != root.end() && !it->is_null()) {
      return JsonError(key, "is set, which is not supported (it must be null)");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->fingerprint = Sha256Hex(root.dump());  // nlohmann's objects keep their keys sorted

  SCD_ASSIGN_OR_RETURN(const Json* model, RequiredField(root, "", "model"));
  if (!model->is_object()) return JsonError("model", "must be an object");
  // Old files omit model.type; HF then recognises BPE by its merges.
  std::string model_type = "BPE";
  if (model->contains("type")) {
    SCD_ASSIGN_OR_RETURN(model_type, GetType(*model, "model"));
  } else if (!model->contains("merges")) {
    return JsonError("model.type", "is missing");
  }
  if (model_type != "BPE") {
    return JsonError("model.type", Concat("\"", model_type, "\" is not supported"));
  }
  SCD_ASSIGN_OR_RETURN(impl->model, BpeModel::FromJson(*model, "model"));

  SCD_ASSIGN_OR_RETURN(const Json* normalizer, OptionalComponent(root, "normalizer"));
  if (normalizer != nullptr) {
    SCD_ASSIGN_OR_RETURN(impl->normalizer,
                         tokenizer_internal::ParseNormalizer(*normalizer, "normalizer"));
  }
  SCD_ASSIGN_OR_RETURN(const Json* pre_tokenizer, OptionalComponent(root, "pre_tokenizer"));
  if (pre_tokenizer != nullptr) {
    SCD_ASSIGN_OR_RETURN(impl->pre_tokenizer,
                         tokenizer_internal::ParsePreTokenizer(*pre_tokenizer, "pre_tokenizer"));
  }
  SCD_ASSIGN_OR_RETURN(const Json* post_processor, OptionalComponent(root, "post_processor"));
  if (post_processor != nullptr) {
    SCD_ASSIGN_OR_RETURN(impl->post_template,
                         ParsePostProcessor(*post_processor, "post_processor"));
  }
  SCD_ASSIGN_OR_RETURN(const Json* decoder, OptionalComponent(root, "decoder"));
  if (decoder != nullptr) {
    SCD_ASSIGN_OR_RETURN(impl->decoder, tokenizer_internal::ParseDecoder(*decoder, "decoder"));
  }
  auto added_it = root.find("added_tokens");
  SCD_ASSIGN_OR_RETURN(impl->added,
                       AddedVocabulary::Build(added_it == root.end() ? nullptr : &*added_it,
                                              *impl->model, impl->normalizer.get()));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

namespace {
std::atomic<int64_t> texts_encoded{0};
}  // namespace

int64_t Tokenizer::TextsEncoded() { return texts_encoded.load(std::memory_order_relaxed); }

const std::string& Tokenizer::fingerprint() const { return impl_->fingerprint; }

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  texts_encoded.fetch_add(1, std::memory_order_relaxed);
  const size_t bad = tokenizer_internal::FirstInvalidUtf8(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        Concat("Encode: input is not valid UTF-8 (ill-formed sequence at byte ", bad, ")"));
  }
  const Impl& impl = *impl_;
  std::vector<TokenId> ids;
  std::vector<PreToken> pieces;
  // AddedVocabulary::extract_and_normalize: raw added tokens are split out of the input first;
  // each remaining piece is normalized on its own, then searched for normalized added tokens.
  for (const AddedSplit& raw : impl.added->SplitRaw(text)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    if (raw.start == raw.end) continue;
    std::string normalized(text.substr(raw.start, raw.end - raw.start));
    if (impl.normalizer != nullptr) impl.normalizer->Normalize(&normalized);
    for (const AddedSplit& split : impl.added->SplitNormalized(normalized)) {
      if (split.id >= 0) {
        ids.push_back(split.id);
        continue;
      }
      if (split.start == split.end) continue;
      pieces.clear();
      pieces.push_back({normalized.substr(split.start, split.end - split.start),
                        raw.start == 0 && split.start == 0});
      if (impl.pre_tokenizer != nullptr) impl.pre_tokenizer->PreTokenize(&pieces);
      for (const PreToken& piece : pieces) impl.model->Tokenize(piece.text, &ids);
    }
  }
  if (!add_special_tokens) return ids;
  std::vector<TokenId> out;
  out.reserve(ids.size() + 4);
  for (const auto& piece : impl.post_template) {
    if (piece.is_sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), piece.ids.begin(), piece.ids.end());
    }
  }
  return out;
}

std::string Tokenizer::Decode(absl::Span<const TokenId> ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const TokenId id : ids) {
    const std::string* token = impl.TokenString(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && impl.added->IsSpecialToken(*token)) continue;
    tokens.push_back(*token);
  }
  if (impl.decoder == nullptr) return absl::StrJoin(tokens, " ");
  impl.decoder->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

int32_t Tokenizer::vocab_size() const {
  return std::max(impl_->model->IdLimit(), impl_->added->IdLimit());
}

std::optional<TokenId> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = impl_->added->TokenToId(token)) return id;
  return impl_->model->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(TokenId id) const {
  const std::string* token = impl_->TokenString(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::IsSpecial(TokenId id) const {
  const std::string* token = impl_->TokenString(id);
  return token != nullptr && impl_->added->IsSpecialToken(*token);
}

std::optional<TokenId> Tokenizer::bos_token_id() const {
  for (const auto& piece : impl_->post_template) {
    if (piece.is_sequence) break;
    if (!piece.ids.empty()) return piece.ids.front();
  }
  return std::nullopt;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  for (const char* letter : {"a", "e", "t", "x"}) {
    const std::optional<TokenId> id = tokenizer.TokenToId(letter);
    if (!id || tokenizer.IsSpecial(*id)) continue;
    const TokenId pair[] = {*id, *id};
    const std::string once = tokenizer.Decode(absl::MakeConstSpan(pair, 1));
    const bool plain = !once.empty() && std::all_of(once.begin(), once.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    });
    if (plain && tokenizer.Decode(pair) == once + once) {
      anchor_ = id;
      anchor_text_ = once;
      break;
    }
  }
}

std::string StreamingDetokenizer::DecodeMidSequence(absl::Span<const TokenId> ids) const {
  if (!trimmed_ || !anchor_) return tokenizer_.Decode(ids);
  std::vector<TokenId> anchored;
  anchored.reserve(ids.size() + 1);
  anchored.push_back(*anchor_);
  anchored.insert(anchored.end(), ids.begin(), ids.end());
  std::string text = tokenizer_.Decode(anchored);
  if (text.compare(0, anchor_text_.size(), anchor_text_) != 0) return tokenizer_.Decode(ids);
  return text.substr(anchor_text_.size());
}

std::string StreamingDetokenizer::Push(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return "";
  window_.push_back(id);
  return Emit(/*force=*/false);
}

std::string StreamingDetokenizer::Flush() {
  std::string out = window_.size() > read_offset_ ? Emit(/*force=*/true) : "";
  window_.clear();
  read_offset_ = 0;
  trimmed_ = false;
  return out;
}

std::string StreamingDetokenizer::Emit(bool force) {
  // Decoding the emitted tokens with and without the pending ones cancels the decoder's
  // start-of-text effects (Strip, Metaspace) and lets byte tokens regroup across the boundary.
  const std::string prefix_text =
      DecodeMidSequence(absl::MakeConstSpan(window_).first(read_offset_));
  const std::string full_text = DecodeMidSequence(window_);
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const bool incomplete = full_text.size() >= kReplacement.size() &&
                          full_text.compare(full_text.size() - kReplacement.size(),
                                            kReplacement.size(), kReplacement) == 0;
  const size_t pending = window_.size() - read_offset_;
  if (!force && (incomplete || full_text.size() <= prefix_text.size()) && pending < kMaxPending) {
    return "";
  }
  size_t cut = prefix_text.size();
  if (full_text.compare(0, cut, prefix_text) != 0) {
    // Only when the held-back bytes were invalid: keep the output valid UTF-8 by cutting at the
    // next character boundary.
    cut = std::min(cut, full_text.size());
    while (cut < full_text.size() && (static_cast<unsigned char>(full_text[cut]) & 0xC0) == 0x80) {
      ++cut;
    }
  }
  std::string out = full_text.substr(std::min(cut, full_text.size()));
  if (read_offset_ > 0) trimmed_ = true;
  window_.erase(window_.begin(), window_.begin() + static_cast<ptrdiff_t>(read_offset_));
  read_offset_ = window_.size();
  return out;
}

}  // namespace scd
