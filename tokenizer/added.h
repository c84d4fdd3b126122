// Added tokens of tokenizer.json (`added_tokens`): the tokens matched in the input before the
// model runs, with HF's AddedVocabulary rules (id assignment, leftmost-longest matching like its
// aho-corasick automaton, single_word / lstrip / rstrip, normalized vs raw matching).
//
// Thread-safety: an AddedVocabulary is immutable after Build; all methods are const.
#ifndef SCD_TOKENIZER_ADDED_H_
#define SCD_TOKENIZER_ADDED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json.h"
#include "tokenizer/normalizer.h"

namespace scd::tokenizer_internal {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What id_to_token (and so decode) gives for it: HF stores the normalized content of
  // normalized tokens, so `<|x|>` decodes as "▁<|x|>" under a Prepend normalizer, and is then not
  // recognised as special by skip_special_tokens (which compares against the raw content).
  std::string token_string;
};

// A piece of input after added-token extraction: either an added token or text to tokenize.
struct AddedSplit {
  size_t start;
  size_t end;
  int32_t id;  // -1 for plain text
};

class AddedVocabulary {
 public:
  // Reads the `added_tokens` array (null for none). Ids are assigned as HF does when it loads a
  // file: the model's id when the content is in its vocabulary, else the next free id.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Build(const Json* added_tokens,
                                                                const BpeModel& model,
                                                                const Normalizer* normalizer);

  // Splits `text` around the raw (normalized=false) or the normalized added tokens.
  std::vector<AddedSplit> SplitRaw(std::string_view text) const { return Split(text, raw_); }
  std::vector<AddedSplit> SplitNormalized(std::string_view text) const {
    return Split(text, normalized_);
  }

  std::optional<int32_t> TokenToId(std::string_view content) const;
  const std::string* IdToToken(int32_t id) const;
  bool IsSpecialToken(std::string_view content) const {
    return special_set_.contains(absl::string_view(content.data(), content.size()));
  }
  // One past the largest added id (0 if none).
  int32_t IdLimit() const { return id_limit_; }

 private:
  // A byte trie of token contents for leftmost-longest matching.
  struct Trie {
    struct Node {
      absl::flat_hash_map<unsigned char, int32_t> children;
      int32_t id = -1;  // added token id ending here
    };
    std::vector<Node> nodes{Node()};
    bool first_byte[256] = {};
    void Insert(std::string_view pattern, int32_t id);
  };

  std::vector<AddedSplit> Split(std::string_view text, const Trie& trie) const;

  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<int32_t, AddedToken> id_to_token_;
  absl::flat_hash_set<std::string> special_set_;
  Trie raw_;
  Trie normalized_;
  int32_t id_limit_ = 0;
};

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_ADDED_H_
