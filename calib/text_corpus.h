// TextCorpus: a text file split into documents and tokenized, from which calibration prefixes
// and evaluation windows are cut. Documents are separated by `<|endoftext|>` lines when the file
// has them (TinyStories train, fables), else by blank lines (TinyStories valid, WikiText).
// A sequence starts at a document start with BOS and runs on through the following documents
// (joined by newlines) until it is long enough.
// Thread-safety: immutable after Load(); safe to share.
#ifndef SCD_CALIB_TEXT_CORPUS_H_
#define SCD_CALIB_TEXT_CORPUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace scd {

class TextCorpus {
 public:
  static absl::StatusOr<TextCorpus> Load(const std::string& path, const Tokenizer& tokenizer);

  size_t documents() const { return docs_.size(); }
  const std::string& path() const { return path_; }

  // `count` token sequences of exactly `length` tokens (BOS first), starting at documents spread
  // evenly over [begin_fraction, end_fraction) of the file. Fails if the range cannot supply them.
  absl::StatusOr<std::vector<std::vector<TokenId>>> Sequences(int count, int length,
                                                              double begin_fraction = 0.0,
                                                              double end_fraction = 1.0) const;

 private:
  std::string path_;
  std::vector<std::vector<TokenId>> docs_;  // each without BOS
  std::vector<TokenId> newline_;            // tokens joining documents
  std::optional<TokenId> bos_;
};

}  // namespace scd

#endif  // SCD_CALIB_TEXT_CORPUS_H_
