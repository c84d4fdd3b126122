// Differential test: the C++ Tokenizer against the official Hugging Face `tokenizers` library
// (npm package, run by tests/tokenizer_reference.js) on thousands of generated strings and id
// sequences per tokenizer.json. Any difference in ids or decoded text fails the test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kTokenizersVersion[] = "0.23.2";

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}
using testing::ReadFile;
using testing::SharedDir;

std::string Escape(const std::string& s) {
  return Json(s).dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
}

std::string IdsToString(const std::vector<TokenId>& ids) { return Json(ids).dump(); }

// Deterministic generator of test inputs (fixed seed, no implementation-defined distributions).
class InputGenerator {
 public:
  explicit InputGenerator(uint64_t seed) : rng_(seed) {
    for (const char* name :
         {"fables_fairytales.txt", "tinystories_train_head.txt", "tinystories_valid_hf.txt",
          "wikitext2_test.raw.txt", "tinystories_train_prompts.txt"}) {
      corpus_.push_back(ReadFile((fs::path(SharedDir()) / "data" / name).string()));
    }
  }

  size_t Uniform(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  bool Chance(int percent) { return Uniform(100) < static_cast<size_t>(percent); }

  // A random window of real text, cut at character boundaries.
  std::string RealText(size_t max_len) {
    const std::string& text = corpus_[Uniform(corpus_.size())];
    size_t start = Uniform(text.size());
    if (Chance(50)) {  // start at a line beginning
      const size_t nl = text.rfind('\n', start);
      start = nl == std::string::npos ? 0 : nl + 1;
    }
    size_t end = std::min(text.size(), start + 1 + Uniform(max_len));
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    return text.substr(start, end - start);
  }

  // One random "character" (possibly a multi-code-point cluster) from many scripts and classes.
  std::string RandomChar() {
    struct Range {
      char32_t lo, hi;
    };
    // All assigned no later than Unicode 13 (utf8proc / PCRE2 / Rust agree on them).
    static const Range kRanges[] = {
        {0x20, 0x7E},       {0x20, 0x7E},       {0x20, 0x7E},       {0x61, 0x7A},
        {0xA0, 0xFF},       {0x100, 0x24F},     {0x391, 0x3A1},     {0x3A3, 0x3C9},
        {0x410, 0x44F},     {0x621, 0x64A},     {0x660, 0x669},     {0x5D0, 0x5EA},
        {0x905, 0x939},     {0x93E, 0x94D},     {0x966, 0x96F},     {0xE01, 0xE3A},
        {0x4E00, 0x9FA5},   {0xAC00, 0xD7A3},   {0x1100, 0x1112},   {0x1161, 0x1175},
        {0x300, 0x36F},     {0x1F600, 0x1F64F}, {0x1F300, 0x1F5FF}, {0x1F3FB, 0x1F3FF},
        {0x1F1E6, 0x1F1FF}, {0x2160, 0x2188},   {0xB2, 0xB3},       {0xFF01, 0xFF5E},
        {0x2010, 0x2027},   {0x3001, 0x3011},   {0x0, 0x1F},        {0x7F, 0x9F},
        {0x2000, 0x200A},   {0x200B, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x2064},
        {0xFB00, 0xFB06},   {0x1E00, 0x1EFF},   {0x2100, 0x214F},   {0xFE00, 0xFE0F},
    };
    static const char32_t kSpecials[] = {0xA0,   0x3000, 0x180E, 0x85,   0x1680, 0x2028, 0x2029,
                                         0x202F, 0x205F, 0xFEFF, 0xFFFD, 0x17F,  0x212A, 0x212B,
                                         0x2126, 0x130,  0x131,  0x3C2,  0x1E9E, 0xDF,   0x2581};
    static const char* kClusters[] = {
        "\U0001F468\u200D\U0001F469\u200D\U0001F467",  // family ZWJ sequence
        "\U0001F44D\U0001F3FD",                        // thumbs up, skin tone
        "\U0001F3F3\uFE0F\u200D\U0001F308",            // rainbow flag
        "\u2764\uFE0F",
        "e\u0301",
        "A\u030A",
        "o\u0308\u0304",
        "\u1100\u1161\u11A8",  // decomposed Hangul syllable
        "\r\n",
        "\t",
        "\n\n",
        "  ",
        "'s",
        "'S",
        "'LL",
        "'ll",
        "'Re",
        "'VE",
        "'d",
        "'M",
        "'T",
        " '",
        "...",
        "\u2581",
    };
    const size_t pick = Uniform(100);
    std::string out;
    if (pick < 70) {
      const Range& r = kRanges[Uniform(std::size(kRanges))];
      tokenizer_internal::AppendUtf8(r.lo + static_cast<char32_t>(Uniform(r.hi - r.lo + 1)), &out);
    } else if (pick < 85) {
      tokenizer_internal::AppendUtf8(kSpecials[Uniform(std::size(kSpecials))], &out);
    } else {
      out = kClusters[Uniform(std::size(kClusters))];
    }
    return out;
  }

  std::string RandomUnicode(size_t max_chars) {
    std::string out;
    const size_t n = 1 + Uniform(max_chars);
    for (size_t i = 0; i < n; ++i) out += RandomChar();
    return out;
  }

  std::string Whitespace() {
    static const char* kPieces[] = {" ",      "  ",     "\t",     "\n",     "\r\n",   "\r",
                                    "\v",     "\f",     "\u00A0", "\u3000", "\u2003", "\u180E",
                                    "\u0085", "\u2028", "\u200A", " \n "};
    std::string out;
    const size_t n = 1 + Uniform(8);
    for (size_t i = 0; i < n; ++i) out += kPieces[Uniform(std::size(kPieces))];
    return out;
  }

  std::string Contractions() {
    static const char* kWords[] = {
        "it",  "IT",  "He",  "don",  "I",     "we", "They", "you",   "'s",  "'S",  "'t", "'T",
        "'re", "'RE", "'Re", "'ve",  "'VE",   "'m", "'M",   "'ll",   "'LL", "'Ll", "'d", "'D",
        "'",   "''",  "12",  "3.14", "1,000", "x2", "٣",    "²",     "!",   "?!",  "--", "(",
        ")",   "\"",  "...", "@-@",  "#",     "$5", "%",    "&amp;", "_",   "é",   "ſ",  " "};
    std::string out;
    const size_t n = 1 + Uniform(10);
    for (size_t i = 0; i < n; ++i) {
      out += kWords[Uniform(std::size(kWords))];
      if (Chance(40)) out += " ";
    }
    return out;
  }

  std::string WithAddedTokens() {
    static const char* kTokens[] = {"<s>",
                                    "</s>",
                                    "<unk>",
                                    "<|start_story|>",
                                    "<|end_story|>",
                                    "<|endoftext|>",
                                    "<|start",
                                    "story|>",
                                    "<|",
                                    "|>",
                                    "<s",
                                    "s>",
                                    "< s>",
                                    "<<s>>",
                                    "<|endoftext|><|endoftext|>",
                                    "<S>",
                                    "<|START_STORY|>",
                                    " <s> "};
    std::string out;
    const size_t n = 1 + Uniform(5);
    for (size_t i = 0; i < n; ++i) {
      if (Chance(50)) out += Chance(50) ? RealText(30) : RandomUnicode(4);
      if (Chance(30)) out += " ";
      out += kTokens[Uniform(std::size(kTokens))];
      if (Chance(30)) out += Chance(50) ? " " : "\n";
    }
    return out;
  }

  std::string Long() {
    std::string out;
    while (out.size() < 3000 + Uniform(6000)) {
      switch (Uniform(4)) {
        case 0:
          out += RealText(800);
          break;
        case 1:
          out += RandomUnicode(40);
          break;
        case 2:
          out += Whitespace();
          break;
        default:
          out += WithAddedTokens();
      }
    }
    return out;
  }

  std::vector<std::string> Texts() {
    std::vector<std::string> texts = {"",
                                      " ",
                                      "  ",
                                      "\n",
                                      "\t",
                                      "a",
                                      "A",
                                      "\u2581",
                                      "\u00E9",
                                      "\U0001F600",
                                      "'s",
                                      "'S",
                                      "<s>",
                                      "</s>",
                                      "<unk>",
                                      "<|endoftext|>",
                                      "<|start_story|>",
                                      "<|start"};
    for (int i = 0; i < 700; ++i) texts.push_back(RealText(i < 100 ? 40 : 400));
    for (int i = 0; i < 600; ++i) texts.push_back(RandomUnicode(i < 100 ? 1 : 24));
    for (int i = 0; i < 150; ++i) texts.push_back(Whitespace() + RandomUnicode(3) + Whitespace());
    for (int i = 0; i < 200; ++i) texts.push_back(Contractions());
    for (int i = 0; i < 250; ++i) texts.push_back(WithAddedTokens());
    for (int i = 0; i < 150; ++i) {
      std::string mixed;
      for (int k = 0; k < 4; ++k) mixed += Chance(50) ? RealText(60) : RandomUnicode(6);
      texts.push_back(mixed);
    }
    for (int i = 0; i < 12; ++i) texts.push_back(Long());
    return texts;
  }

  // Id sequences for decode-only comparison: random ids (some out of range), runs of byte tokens
  // that form valid and invalid UTF-8, and truncated encodings.
  std::vector<std::vector<TokenId>> IdSeqs(const Tokenizer& tokenizer,
                                           const std::vector<std::vector<TokenId>>& encodings) {
    std::vector<TokenId> byte_ids;  // "<0xXX>" tokens, or byte-level alphabet tokens
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto id = tokenizer.TokenToId(name)) byte_ids.push_back(*id);
    }
    if (byte_ids.empty()) {
      for (TokenId id = 0; id < std::min<TokenId>(256, tokenizer.vocab_size()); ++id) {
        byte_ids.push_back(id);
      }
    }
    const auto vocab = static_cast<size_t>(tokenizer.vocab_size());
    std::vector<std::vector<TokenId>> seqs = {{}};
    for (int i = 0; i < 600; ++i) {
      std::vector<TokenId> seq;
      const size_t n = Uniform(24);
      for (size_t k = 0; k < n; ++k) {
        const size_t kind = Uniform(10);
        if (kind < 4) {
          seq.push_back(static_cast<TokenId>(Uniform(vocab)));
        } else if (kind < 8) {
          const size_t run = 1 + Uniform(5);
          for (size_t r = 0; r < run; ++r) seq.push_back(byte_ids[Uniform(byte_ids.size())]);
        } else if (kind < 9) {
          seq.push_back(static_cast<TokenId>(Uniform(4)));  // special tokens live low
        } else {
          seq.push_back(static_cast<TokenId>(vocab + Uniform(3)));  // not in the vocabulary
        }
      }
      seqs.push_back(std::move(seq));
    }
    for (size_t i = 0; i < 200 && !encodings.empty(); ++i) {
      const auto& enc = encodings[Uniform(encodings.size())];
      const size_t a = Uniform(enc.size() + 1);
      const size_t b = a + Uniform(enc.size() - a + 1);
      seqs.emplace_back(enc.begin() + static_cast<ptrdiff_t>(a),
                        enc.begin() + static_cast<ptrdiff_t>(b));
    }
    return seqs;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> corpus_;
};

// The tokenizer.json files under test: every model's and every standalone file, grouped by
// identical content.
std::map<std::string, std::vector<std::string>> TokenizerFilesByContent() {
  std::vector<std::string> paths;
  for (const auto& dir : fs::directory_iterator(fs::path(SharedDir()) / "models")) {
    const fs::path candidate = dir.path() / "tokenizer.json";
    if (fs::exists(candidate)) paths.push_back(candidate.string());
  }
  for (const auto& entry : fs::directory_iterator(fs::path(SharedDir()) / "tokenizers")) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::map<std::string, std::vector<std::string>> by_content;
  for (const auto& path : paths) by_content[ReadFile(path)].push_back(path);
  return by_content;
}

int RunCommand(const std::string& command) {
  const int status = std::system(command.c_str());
  return status == -1 ? -1 : WEXITSTATUS(status);
}

class TokenizerDiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    module_dir_ = EnvOr("SCD_TOKENIZERS_MODULE",
                        std::string(SCD_BUILD_DIR) + "/node/node_modules/tokenizers");
    script_ = std::string(SCD_SOURCE_DIR) + "/tests/tokenizer_reference.js";
    work_dir_ = fs::temp_directory_path() / ("scd_tokenizer_diff_" + std::to_string(getpid()));
    fs::create_directories(work_dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(work_dir_, ignored);
  }

  // `check_streaming`: also expect StreamingDetokenizer to reproduce lossless decodes.
  void Compare(const std::string& json_path, const std::string& content,
               const std::vector<std::string>& names, uint64_t seed, bool check_streaming = true);

  std::string module_dir_;
  std::string script_;
  fs::path work_dir_;
};

// Checks that node and the pinned reference package are there.
void RequireReference(const std::string& module_dir) {
  ASSERT_EQ(RunCommand("node --version > /dev/null 2>&1"), 0)
      << "node is not available: the differential test needs Node.js to run the reference "
         "Hugging Face tokenizers library";
  const fs::path package_json = fs::path(module_dir) / "package.json";
  ASSERT_TRUE(fs::exists(package_json))
      << "npm package tokenizers@" << kTokenizersVersion << " is not installed at " << module_dir
      << " (the ctest fixture tokenizer_npm_install installs it; run `ctest -R tokenizer`)";
  const Json package = Json::parse(ReadFile(package_json));
  ASSERT_EQ(package.value("version", ""), kTokenizersVersion)
      << "wrong tokenizers version at " << module_dir;
}

// Generates inputs for the tokenizer in `json_path` (whose contents are `content`), runs both
// implementations and expects no difference. `names` are the files it stands for.
void TokenizerDiffTest::Compare(const std::string& json_path, const std::string& content,
                                const std::vector<std::string>& names, uint64_t seed,
                                bool check_streaming) {
  std::string label;
  for (const auto& name : names) label += "\n  " + name;
  SCOPED_TRACE(label);
  auto tokenizer = Tokenizer::FromJson(content);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& tok = **tokenizer;

  InputGenerator gen(seed);
  std::vector<std::string> texts = gen.Texts();
  std::vector<std::vector<TokenId>> encodings;
  for (const auto& text : texts) {
    auto ids = tok.Encode(text);
    encodings.push_back(ids.ok() ? *ids : std::vector<TokenId>{});
  }
  const auto id_seqs = gen.IdSeqs(tok, encodings);

  const std::string tag = std::to_string(seed);
  const fs::path in_path = work_dir_ / ("in" + tag + ".json");
  const fs::path out_path = work_dir_ / ("out" + tag + ".json");
  const fs::path err_path = work_dir_ / ("err" + tag + ".txt");
  {
    std::ofstream in(in_path, std::ios::binary);
    in << Json{{"texts", texts}, {"id_seqs", id_seqs}}.dump();
  }
  const std::string command = "node '" + script_ + "' '" + json_path + "' '" + in_path.string() +
                              "' '" + out_path.string() + "' '" + module_dir_ + "' 2> '" +
                              err_path.string() + "'";
  ASSERT_EQ(RunCommand(command), 0) << "reference script failed: " << command << "\n"
                                    << ReadFile(err_path);
  const Json ref = Json::parse(ReadFile(out_path));
  ASSERT_EQ(ref["texts"].size(), texts.size());
  ASSERT_EQ(ref["id_seqs"].size(), id_seqs.size());
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int32_t>());
  int mismatches = 0;
  std::ostringstream report;
  auto note = [&](const std::string& what, const std::string& input, const std::string& cpp,
                  const std::string& hf) {
    if (++mismatches <= 8) {
      report << "  " << what << " for input " << Escape(input) << "\n    C++: " << cpp
             << "\n    HF:  " << hf << "\n";
    }
  };
  size_t streamed = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Json& r = ref["texts"][i];
    const auto want = r["ids"].get<std::vector<TokenId>>();
    const auto want_plain = r["ids_plain"].get<std::vector<TokenId>>();
    auto got = tok.Encode(texts[i]);
    auto got_plain = tok.Encode(texts[i], /*add_special_tokens=*/false);
    if (!got.ok() || *got != want) {
      note("encode", texts[i], got.ok() ? IdsToString(*got) : got.status().ToString(),
           IdsToString(want));
    }
    if (!got_plain.ok() || *got_plain != want_plain) {
      note("encode(add_special_tokens=false)", texts[i],
           got_plain.ok() ? IdsToString(*got_plain) : got_plain.status().ToString(),
           IdsToString(want_plain));
    }
    const std::string decoded = tok.Decode(want, false);
    const std::string decoded_skip = tok.Decode(want, true);
    if (decoded != r["decoded"].get<std::string>()) {
      note("decode " + IdsToString(want), texts[i], Escape(decoded), r["decoded"].dump());
    }
    if (decoded_skip != r["decoded_skip"].get<std::string>()) {
      note("decode(skip_special) " + IdsToString(want), texts[i], Escape(decoded_skip),
           r["decoded_skip"].dump());
    }
    // Streaming must reproduce the reference decode whenever it had nothing lossy in it.
    const std::string want_skip = r["decoded_skip"].get<std::string>();
    if (check_streaming && want_skip.find("\xEF\xBF\xBD") == std::string::npos) {
      StreamingDetokenizer stream(tok, /*skip_special_tokens=*/true);
      std::string concatenated;
      for (const TokenId id : want) concatenated += stream.Push(id);
      concatenated += stream.Flush();
      ++streamed;
      if (concatenated != want_skip) {
        note("streaming decode " + IdsToString(want), texts[i], Escape(concatenated),
             Escape(want_skip));
      }
    }
  }
  for (size_t i = 0; i < id_seqs.size(); ++i) {
    const Json& r = ref["id_seqs"][i];
    const std::string decoded = tok.Decode(id_seqs[i], false);
    const std::string decoded_skip = tok.Decode(id_seqs[i], true);
    if (decoded != r["decoded"].get<std::string>()) {
      note("decode", IdsToString(id_seqs[i]), Escape(decoded), r["decoded"].dump());
    }
    if (decoded_skip != r["decoded_skip"].get<std::string>()) {
      note("decode(skip_special)", IdsToString(id_seqs[i]), Escape(decoded_skip),
           r["decoded_skip"].dump());
    }
  }
  std::cout << "[tokenizer diff] " << texts.size() << " strings (x2 encodes, x2 decodes, "
            << streamed << " streamed) and " << id_seqs.size()
            << " id sequences (x2 decodes) vs HF tokenizers " << ref["version"].get<std::string>()
            << ": " << mismatches << " mismatches; tokenizer:" << label << std::endl;
  EXPECT_EQ(mismatches, 0) << "first mismatches:\n" << report.str();
}

TEST_F(TokenizerDiffTest, MatchesHuggingFaceTokenizers) {
  RequireReference(module_dir_);
  if (HasFatalFailure()) return;
  const auto files = TokenizerFilesByContent();
  ASSERT_GE(files.size(), 4u) << "expected the shared tokenizer files under " << SharedDir();
  uint64_t seed = 0x5CD5E7;
  for (const auto& [content, paths] : files) Compare(paths.front(), content, paths, seed++);
}

// Components the shared files do not use, exercised by editing those files: each variant swaps
// in other normalizers, pre-tokenizers, added-token flags, post-processors and decoders.
TEST_F(TokenizerDiffTest, SyntheticVariantsMatchHuggingFaceTokenizers) {
  RequireReference(module_dir_);
  if (HasFatalFailure()) return;
  const std::string sp512 = SharedDir() + "/models/stories260k/tokenizer.json";
  const std::string sp2048 = SharedDir() + "/models/tinystories-656k/tokenizer.json";
  const std::string gpt2 = SharedDir() + "/tokenizers/gpt2-style-bytelevel.tokenizer.json";
  const std::string qwen2 = SharedDir() + "/tokenizers/qwen2-style-bytelevel.tokenizer.json";
  struct Variant {
    std::string name;
    std::string base;
    Json patch;  // top-level fields to replace
  };
  const std::vector<Variant> variants = {
      {"metaspace-first-split", sp512, Json::parse(R"({
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": true},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                     "split": true}]}})")},
      {"metaspace-always-nosplit", sp512, Json::parse(R"({
        "normalizer": {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "always", "split": false},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                    "split": false}})")},
      {"nfkc-lowercase-strip-digits-punctuation-bert", sp512, Json::parse(R"({
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"},
                       {"type": "Lowercase"}, {"type": "Strip", "strip_left": true,
                       "strip_right": true}, {"type": "Replace", "pattern": {"String": " "},
                       "content": "\u2581"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                          {"type": "Digits", "individual_digits": true},
                          {"type": "Punctuation", "behavior": "Contiguous"}]},
        "post_processor": {"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace",
                    "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2,
                    "stop": 0}]}})")},
      {"nfd-whitespace-roberta-bpedecoder", sp2048, Json::parse(R"({
        "normalizer": {"type": "NFD"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1],
                           "trim_offsets": true, "add_prefix_space": true},
        "decoder": {"type": "BPEDecoder", "suffix": "\u2581"}})")},
      {"nfkd-bertpretokenizer-nodecoder", sp512, Json::parse(R"({
        "normalizer": {"type": "NFKD"},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "decoder": null})")},
      {"digits-contiguous-whitespacesplit", sp512, Json::parse(R"({
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                          {"type": "WhitespaceSplit"},
                          {"type": "Digits", "individual_digits": false}]}})")},
      {"split-behaviors", gpt2, Json::parse(R"({
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
           "invert": false},
          {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "MergedWithNext",
           "invert": false},
          {"type": "Split", "pattern": {"Regex": "[aeiou]+"}, "behavior": "Contiguous",
           "invert": true},
          {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
           "use_regex": false}]}})")},
      {"split-removed-inverted", gpt2, Json::parse(R"({
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "\\w+|[^\\w\\s]+"}, "behavior": "Removed",
           "invert": true},
          {"type": "Split", "pattern": {"Regex": "(?i)[th]"}, "behavior": "Isolated",
           "invert": false},
          {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
           "use_regex": true}]}})")},
      {"added-token-flags", gpt2, Json::parse(R"({
        "normalizer": {"type": "Lowercase"},
        "added_tokens": [
          {"id": 956, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": true},
          {"id": 957, "content": "the", "single_word": true, "lstrip": false,
           "rstrip": false, "normalized": false, "special": false},
          {"id": 958, "content": " cat", "single_word": false, "lstrip": true,
           "rstrip": true, "normalized": false, "special": false},
          {"id": 959, "content": "DOG", "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": true, "special": true},
          {"id": 960, "content": "<s>", "single_word": false, "lstrip": true,
           "rstrip": false, "normalized": false, "special": true},
          {"id": 961, "content": "</s>", "single_word": true, "lstrip": false,
           "rstrip": true, "normalized": true, "special": false},
          {"id": 962, "content": "he", "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": false}]})")},
      {"ignore-merges-nfkd", qwen2, Json::parse(R"({
        "normalizer": {"type": "NFKD"}})")},
  };
  uint64_t seed = 0xA11CE;
  for (const Variant& variant : variants) {
    Json json = Json::parse(ReadFile(variant.base));
    for (const auto& [key, value] : variant.patch.items()) json[key] = value;
    if (variant.name == "ignore-merges-nfkd") json["model"]["ignore_merges"] = true;
    const fs::path path = work_dir_ / (variant.name + ".json");
    const std::string content = json.dump();
    std::ofstream(path, std::ios::binary) << content;
    // BPEDecoder treats the last token differently, which a stream cannot know in advance.
    const bool end_sensitive = variant.name.find("bpedecoder") != std::string::npos;
    Compare(path.string(), content, {variant.name + " (from " + variant.base + ")"}, seed++,
            !end_sensitive);
  }
}

}  // namespace
}  // namespace scd
