#include "tokenizer/added.h"

#include <algorithm>
#include <utility>

#include "base/status_macros.h"
#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {
namespace {

bool SameToken(const AddedToken& a, const AddedToken& b) {
  return a.content == b.content && a.single_word == b.single_word && a.lstrip == b.lstrip &&
         a.rstrip == b.rstrip && a.normalized == b.normalized && a.special == b.special;
}

// Code point ending just before byte `end`. REQUIRES: end > 0, valid UTF-8.
char32_t LastCodePoint(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(text, &start);
}

// Start of the run of whitespace that ends `text` (regex `\s*$`).
size_t TrailingSpaceStart(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!IsWhiteSpace(NextCodePoint(text, &pos))) break;
    end = start;
  }
  return end;
}

// Length of the run of whitespace that starts `text` (regex `^\s*`).
size_t LeadingSpaceLength(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!IsWhiteSpace(NextCodePoint(text, &next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    auto it = nodes[node].children.find(byte);
    if (it == nodes[node].children.end()) {
      nodes.emplace_back();
      const auto child = static_cast<int32_t>(nodes.size() - 1);
      nodes[node].children[byte] = child;
      node = child;
    } else {
      node = it->second;
    }
  }
  // With duplicate patterns aho-corasick reports the first one.
  if (nodes[node].id < 0) nodes[node].id = id;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Build(
    const Json* added_tokens, const BpeModel& model, const Normalizer* normalizer) {
  auto vocab = std::make_unique<AddedVocabulary>();
  std::vector<AddedToken> tokens;
  if (added_tokens != nullptr && !added_tokens->is_null()) {
    if (!added_tokens->is_array()) return JsonError("added_tokens", "must be an array");
    for (size_t i = 0; i < added_tokens->size(); ++i) {
      const Json& entry = (*added_tokens)[i];
      const std::string path = Concat("added_tokens[", i, "]");
      AddedToken token;
      SCD_ASSIGN_OR_RETURN(token.content, GetString(entry, path, "content"));
      if (!IsValidUtf8(token.content)) return JsonError(path, "content is not valid UTF-8");
      SCD_ASSIGN_OR_RETURN(token.single_word, GetBool(entry, path, "single_word", false));
      SCD_ASSIGN_OR_RETURN(token.lstrip, GetBool(entry, path, "lstrip", false));
      SCD_ASSIGN_OR_RETURN(token.rstrip, GetBool(entry, path, "rstrip", false));
      SCD_ASSIGN_OR_RETURN(token.normalized, GetBool(entry, path, "normalized", true));
      SCD_ASSIGN_OR_RETURN(token.special, GetBool(entry, path, "special", false));
      tokens.push_back(std::move(token));
    }
  }

  // AddedVocabulary::add_tokens. The "id" in the file is not used: HF re-derives it.
  std::vector<const AddedToken*> special_tokens, plain_tokens;
  for (const AddedToken& token : tokens) {
    if (token.special && !token.content.empty() && !vocab->special_set_.contains(token.content)) {
      special_tokens.push_back(&token);
      vocab->special_set_.insert(token.content);
    }
  }
  const auto model_size = static_cast<int64_t>(model.VocabCount());
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    if (std::any_of(vocab->id_to_token_.begin(), vocab->id_to_token_.end(),
                    [&](const auto& entry) { return SameToken(entry.second, token); })) {
      continue;
    }
    int64_t new_id;
    if (auto existing = vocab->TokenToId(token.content)) {
      new_id = *existing;
    } else if (auto in_model = model.TokenToId(token.content)) {
      new_id = *in_model;
    } else if (vocab->token_to_id_.empty()) {
      new_id = model_size;
    } else {
      int64_t max_id = 0;
      for (const auto& entry : vocab->token_to_id_)
        max_id = std::max<int64_t>(max_id, entry.second);
      new_id = (max_id >= model_size || model_size == 0) ? max_id + 1 : model_size;
    }
    if (new_id >= INT32_MAX) return JsonError("added_tokens", "too many tokens");
    const auto id = static_cast<int32_t>(new_id);
    vocab->token_to_id_[token.content] = id;
    AddedToken& stored = vocab->id_to_token_[id] = token;
    stored.token_string = token.content;
    if (token.normalized && normalizer != nullptr) normalizer->Normalize(&stored.token_string);
    vocab->id_limit_ = std::max(vocab->id_limit_, id + 1);
    if (!vocab->special_set_.contains(token.content)) plain_tokens.push_back(&token);
  }

  // refresh_added_tokens: special tokens first, then the others, each in file order.
  std::vector<const AddedToken*> ordered = special_tokens;
  ordered.insert(ordered.end(), plain_tokens.begin(), plain_tokens.end());
  for (const AddedToken* token : ordered) {
    auto id = vocab->TokenToId(token->content);
    if (!id) id = model.TokenToId(token->content);
    if (!id) continue;
    if (token->normalized) {
      std::string content = token->content;
      if (normalizer != nullptr) normalizer->Normalize(&content);
      vocab->normalized_.Insert(content, *id);
    } else {
      vocab->raw_.Insert(token->content, *id);
    }
  }
  return vocab;
}

std::optional<int32_t> AddedVocabulary::TokenToId(std::string_view content) const {
  auto it = token_to_id_.find(absl::string_view(content.data(), content.size()));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::IdToToken(int32_t id) const {
  auto it = id_to_token_.find(id);
  return it == id_to_token_.end() ? nullptr : &it->second.token_string;
}

std::vector<AddedSplit> AddedVocabulary::Split(std::string_view text, const Trie& trie) const {
  if (text.empty()) return {{0, 0, -1}};
  std::vector<AddedSplit> splits;
  size_t start_offset = 0;
  size_t search_from = 0;
  while (search_from < text.size()) {
    // Leftmost-longest: the earliest start with any match, and the longest match there.
    size_t start = 0, stop = 0;
    int32_t id = -1;
    for (size_t i = search_from; i < text.size() && id < 0; ++i) {
      if (!trie.first_byte[static_cast<unsigned char>(text[i])]) continue;
      int32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        auto it = trie.nodes[node].children.find(static_cast<unsigned char>(text[j]));
        if (it == trie.nodes[node].children.end()) break;
        node = it->second;
        if (trie.nodes[node].id >= 0) {
          id = trie.nodes[node].id;
          start = i;
          stop = j + 1;
        }
      }
    }
    if (id < 0) break;
    search_from = stop;
    const AddedToken& token = id_to_token_.at(id);
    if (token.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastCodePoint(text, start));
      size_t after = stop;
      const bool stop_space = stop == text.size() || !IsWordChar(NextCodePoint(text, &after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset != text.size()) splits.push_back({start_offset, text.size(), -1});
  return splits;
}

}  // namespace scd::tokenizer_internal
