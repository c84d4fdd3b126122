// Tokenizer: encodes text to token ids and decodes ids to text from a Hugging Face
// `tokenizer.json`, reproducing the HF `tokenizers` library exactly (same ids, same decoded text,
// including its lossy UTF-8 handling). Supports BPE models with the usual normalizers,
// pre-tokenizers, post-processors and decoders; anything else is rejected at load time with an
// error naming the unsupported component. No libtorch dependency.
//
// Thread-safety: a loaded Tokenizer is immutable; Encode/Decode are safe from many threads.
// A StreamingDetokenizer is a per-stream object: use one per sequence, from one thread at a time.
#ifndef SCD_TOKENIZER_TOKENIZER_H_
#define SCD_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/token_id.h"

namespace scd {

class Tokenizer {
 public:
  // Loads a tokenizer.json file. NotFound if it cannot be read; InvalidArgument naming the field
  // for malformed or unsupported content.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Same, from the file's contents.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Like HF tokenizer.encode(text, add_special_tokens).getIds(). InvalidArgument for invalid
  // UTF-8 input.
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                              bool add_special_tokens = true) const;

  // Like HF tokenizer.decode(ids, skip_special_tokens): ids outside the vocabulary are skipped,
  // and invalid byte sequences become U+FFFD exactly where HF puts them.
  std::string Decode(absl::Span<const TokenId> ids, bool skip_special_tokens = false) const;

  // Model vocabulary plus added tokens: one past the largest id.
  int32_t vocab_size() const;
  // Added tokens first, then the model vocabulary, like HF token_to_id / id_to_token. As in HF,
  // an added token with normalized=true reports its normalized form (e.g. "▁<|start_story|>").
  std::optional<TokenId> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(TokenId id) const;
  // True for ids that Decode(..., skip_special_tokens=true) drops: special added tokens, except
  // (as in HF) those with normalized=true whose normalized form differs from their content.
  bool IsSpecial(TokenId id) const;
  // The BOS id the post-processor puts before the text (first special token of the template for
  // a single sequence), if any.
  std::optional<TokenId> bos_token_id() const;
  // SHA-256 (hex) of the tokenizer.json's content in a canonical form (keys sorted, no
  // whitespace): two tokenizers with the same fingerprint encode every text alike. A coordinator
  // refuses a node whose tokenizer's differs from its own (registry.proto).
  const std::string& fingerprint() const;
  // Texts Encode has tokenized in this process so far (a request's prompt is tokenized once in
  // the whole deployment: tests count it).
  static int64_t TextsEncoded();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<const Impl> impl);

  std::unique_ptr<const Impl> impl_;
};

// Incremental detokenizer for streaming generation. Push returns the newly completed text; it
// never emits half a UTF-8 character (incomplete bytes are held back), and the concatenation of
// all Push() and Flush() outputs equals tokenizer.Decode(all ids, skip_special_tokens) whenever
// that decode has no U+FFFD from invalid bytes (and the decoder has no rule for the last token:
// BPEDecoder's suffix and Strip's `stop` depend on what comes next, so streams can differ there).
// The work per Push is bounded: only a small window of recent tokens is decoded (the prefix/read
// offsets scheme of vLLM).
class StreamingDetokenizer {
 public:
  // REQUIRES: `tokenizer` outlives this object.
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one generated id; returns the text it completes (possibly empty).
  std::string Push(TokenId id);
  // Emits whatever is held back (lossily), at the end of generation, and resets the stream.
  std::string Flush();

 private:
  // Most tokens held back waiting for the rest of a character before emitting anyway.
  static constexpr size_t kMaxPending = 16;

  std::string Emit(bool force);
  // Decode of `ids` as it reads in the middle of a sequence (see anchor_).
  std::string DecodeMidSequence(absl::Span<const TokenId> ids) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // A plain token (decodes to the same letters anywhere) put before a window that does not start
  // the sequence, so decoder rules for the start of text (Strip, Metaspace) do not fire on it.
  std::optional<TokenId> anchor_;
  std::string anchor_text_;
  bool trimmed_ = false;  // whether the window has lost the start of the sequence
  // Window of recent ids: [0, read_offset_) was emitted already and gives the decoder its left
  // context; [read_offset_, size) is pending.
  std::vector<TokenId> window_;
  size_t read_offset_ = 0;
};

}  // namespace scd

#endif  // SCD_TOKENIZER_TOKENIZER_H_
