#include "calib/text_corpus.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<TextCorpus> TextCorpus::Load(const std::string& path, const Tokenizer& tokenizer) {
  absl::StatusOr<std::string> text_or = ReadFileToString(path);
  if (!text_or.ok()) {
    return absl::Status(text_or.status().code(),
                        absl::StrCat("cannot open text file: ", text_or.status().message()));
  }
  const std::string& text = *text_or;
  const bool eot = text.find("<|endoftext|>") != std::string::npos;
  std::vector<std::string> pieces;
  if (eot) {
    for (absl::string_view doc : absl::StrSplit(text, "<|endoftext|>")) pieces.emplace_back(doc);
  } else {
    for (absl::string_view doc : absl::StrSplit(text, absl::ByString("\n\n"))) {
      pieces.emplace_back(doc);
    }
  }
  TextCorpus corpus;
  corpus.path_ = path;
  corpus.bos_ = tokenizer.bos_token_id();
  SCD_ASSIGN_OR_RETURN(corpus.newline_, tokenizer.Encode("\n", /*add_special_tokens=*/false));
  for (const std::string& piece : pieces) {
    absl::string_view doc = absl::StripAsciiWhitespace(piece);
    if (doc.empty()) continue;
    SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids,
                         tokenizer.Encode(std::string(doc), /*add_special_tokens=*/false));
    if (!ids.empty()) corpus.docs_.push_back(std::move(ids));
  }
  if (corpus.docs_.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no text"));
  return corpus;
}

absl::StatusOr<std::vector<std::vector<TokenId>>> TextCorpus::Sequences(int count, int length,
                                                                        double begin_fraction,
                                                                        double end_fraction) const {
  if (count <= 0 || length <= 1) {
    return absl::InvalidArgumentError("need a positive count and a length of at least 2");
  }
  const size_t begin = static_cast<size_t>(begin_fraction * docs_.size());
  const size_t end = static_cast<size_t>(end_fraction * docs_.size());
  if (end <= begin || end - begin < static_cast<size_t>(count)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", end - begin, " documents in the chosen range, fewer than the ",
                     count, " sequences asked for"));
  }
  std::vector<std::vector<TokenId>> out;
  const double stride = static_cast<double>(end - begin) / count;
  for (int i = 0; i < count; ++i) {
    size_t d = begin + static_cast<size_t>(i * stride);
    std::vector<TokenId> seq;
    if (bos_) seq.push_back(*bos_);
    while (static_cast<int>(seq.size()) < length && d < end) {
      if (seq.size() > (bos_ ? 1u : 0u)) seq.insert(seq.end(), newline_.begin(), newline_.end());
      seq.insert(seq.end(), docs_[d].begin(), docs_[d].end());
      ++d;
    }
    if (static_cast<int>(seq.size()) < length) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": the text runs out before a ", length,
                                                     "-token sequence (asked for ", count,
                                                     " of them)"));
    }
    seq.resize(length);
    out.push_back(std::move(seq));
  }
  return out;
}

}  // namespace scd
