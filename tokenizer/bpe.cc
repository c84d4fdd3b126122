#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& json,
                                                             std::string_view path) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  if (auto it = json.find("dropout"); it != json.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return JsonError(JsonPath(path, "dropout"),
                       "must be null or 0 (BPE dropout is random and not supported)");
    }
  }
  SCD_ASSIGN_OR_RETURN(model->unk_token_, GetOptionalString(json, path, "unk_token"));
  SCD_ASSIGN_OR_RETURN(auto prefix, GetOptionalString(json, path, "continuing_subword_prefix"));
  SCD_ASSIGN_OR_RETURN(auto suffix, GetOptionalString(json, path, "end_of_word_suffix"));
  model->continuing_subword_prefix_ = prefix.value_or("");
  model->end_of_word_suffix_ = suffix.value_or("");
  SCD_ASSIGN_OR_RETURN(model->byte_fallback_, GetBool(json, path, "byte_fallback", false));
  SCD_ASSIGN_OR_RETURN(model->fuse_unk_, GetBool(json, path, "fuse_unk", false));
  SCD_ASSIGN_OR_RETURN(model->ignore_merges_, GetBool(json, path, "ignore_merges", false));

  SCD_RETURN_IF_ERROR(model->ParseVocab(json, path));
  SCD_RETURN_IF_ERROR(model->ParseMerges(json, path));
  if (model->unk_token_.has_value() && !model->Lookup(*model->unk_token_)) {
    // HF only notices this when an unknown character shows up; failing early is clearer.
    return JsonError(JsonPath(path, "unk_token"),
                     Concat("\"", *model->unk_token_, "\" is not in model.vocab"));
  }
  return model;
}

absl::Status BpeModel::ParseVocab(const Json& json, std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const Json* vocab, RequiredField(json, path, "vocab"));
  const std::string vocab_path = JsonPath(path, "vocab");
  if (!vocab->is_object()) return JsonError(vocab_path, "must be an object of token -> id");
  vocab_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= INT32_MAX) {
      return JsonError(Concat(vocab_path, "[\"", token, "\"]"),
                       "must be a non-negative integer id");
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    vocab_[token] = id;
    vocab_r_[id] = token;
    id_limit_ = std::max(id_limit_, id + 1);
  }
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = Lookup(absl::StrFormat("<0x%02X>", b)).value_or(-1);
  }
  return absl::OkStatus();
}

absl::Status BpeModel::ParseMerges(const Json& json, std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const Json* merges, RequiredField(json, path, "merges"));
  const std::string merges_path = JsonPath(path, "merges");
  if (!merges->is_array()) return JsonError(merges_path, "must be an array");
  merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    const std::string merge_path = Concat(merges_path, "[", rank, "]");
    std::string a, b;
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return JsonError(merge_path, Concat("\"", line, "\" is not of the form \"a b\""));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      return JsonError(merge_path, "must be a string \"a b\" or a pair [\"a\", \"b\"]");
    }
    const auto a_id = Lookup(a);
    const auto b_id = Lookup(b);
    if (!a_id || !b_id) {
      return JsonError(merge_path, Concat("references token \"", !a_id ? a : b,
                                          "\" which is not in model.vocab"));
    }
    const size_t prefix_len = continuing_subword_prefix_.size();
    if (b.size() < prefix_len) {
      return JsonError(merge_path, "right token is shorter than continuing_subword_prefix");
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto new_id = Lookup(merged);
    if (!new_id) {
      return JsonError(merge_path,
                       Concat("produces token \"", merged, "\" which is not in model.vocab"));
    }
    // A later duplicate replaces an earlier one, as when HF collects merges into a HashMap.
    merges_[PairKey(*a_id, *b_id)] = Merge{static_cast<uint32_t>(rank), *new_id};
  }
  return absl::OkStatus();
}

std::optional<int32_t> BpeModel::Lookup(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const { return Lookup(token); }

const std::string* BpeModel::IdToToken(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = Lookup(word)) {
      ids->push_back(*id);
      return;
    }
  }

  std::vector<Symbol> symbols = Symbols(word);
  MergeAll(symbols);
  for (const Symbol& symbol : symbols) {
    if (symbol.len != 0) ids->push_back(symbol.id);
  }
}

std::vector<BpeModel::Symbol> BpeModel::Symbols(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id, size_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, len});
  };

  int32_t unk_id = -1;  // pending unk symbol (-1: none) and its byte length
  size_t unk_len = 0;
  const bool affixes = !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  std::string scratch;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    NextCodePoint(word, &pos);
    const size_t byte_len = pos - start;
    std::string_view s = word.substr(start, byte_len);
    if (affixes) {
      scratch.clear();
      if (start != 0) scratch += continuing_subword_prefix_;
      scratch += s;
      if (pos == word.size()) scratch += end_of_word_suffix_;
      s = scratch;
    }
    if (auto id = Lookup(s)) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char b : s) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all_bytes) {
        // HF leaves a pending unk in place here, so it lands after these byte tokens.
        for (const char b : s) add(byte_ids_[static_cast<unsigned char>(b)], 1);
        continue;
      }
    }
    if (unk_token_.has_value()) {
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = *Lookup(*unk_token_);  // checked at load time
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);
  return symbols;
}

void BpeModel::MergeAll(std::vector<Symbol>& symbols) const {
  // Word::merge_all: repeatedly apply the lowest-ranked merge (leftmost on ties).
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // inverted: priority_queue pops the max
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto find_merge = [this](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Candidate> initial;
  initial.reserve(symbols.size());
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      initial.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(initial));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next == -1) continue;
    const int32_t next_pos = current.next;
    const Symbol right = symbols[next_pos];
    const Merge* m = find_merge(current.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry

    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (current.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[current.prev].id, current.id)) {
        queue.push({pm->rank, current.prev, pm->new_id});
      }
    }
    if (current.next >= 0) {
      if (const Merge* nm = find_merge(current.id, symbols[current.next].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
}

}  // namespace scd::tokenizer_internal
