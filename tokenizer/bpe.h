// The BPE model of tokenizer.json (`model.type` "BPE"): maps one pre-tokenized word to token ids
// by applying ranked merges, exactly as HF's `tokenizers` BPE::merge_word does (including
// byte_fallback, unk fusing, continuing_subword_prefix / end_of_word_suffix and ignore_merges).
//
// Thread-safety: a built BpeModel is immutable; Tokenize is safe from many threads.
#ifndef SCD_TOKENIZER_BPE_H_
#define SCD_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "tokenizer/json.h"

namespace scd::tokenizer_internal {

class BpeModel {
 public:
  // Builds the model from the `model` object at `path`; errors name the offending field (unknown
  // merge tokens, dropout, missing vocab...).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& json,
                                                            std::string_view path);

  // Appends the ids of `word` to `ids`. Characters that have no token, no byte fallback and no
  // unk token are dropped, as in HF.
  // REQUIRES: `word` is valid UTF-8.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token for `id`, or null if the vocabulary has no such id.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t IdLimit() const { return id_limit_; }
  // Number of vocabulary entries (HF's get_vocab_size, which assigns added-token ids from it).
  size_t VocabCount() const { return vocab_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::optional<int32_t> Lookup(std::string_view token) const;
  // FromJson's parts: the vocabulary (and byte tokens), then the merges ranked by position.
  absl::Status ParseVocab(const Json& json, std::string_view path);
  absl::Status ParseMerges(const Json& json, std::string_view path);

  // Tokenize's: the word as symbols (a doubly linked list over a vector; a merged-away symbol
  // gets len == 0), one per character (or its bytes, or an unk), then HF's Word::merge_all.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    size_t len;
  };
  std::vector<Symbol> Symbols(std::string_view word) const;
  void MergeAll(std::vector<Symbol>& symbols) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<int32_t, std::string> vocab_r_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_;  // id of "<0xXX>" per byte, -1 if absent
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t id_limit_ = 0;
};

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_BPE_H_
