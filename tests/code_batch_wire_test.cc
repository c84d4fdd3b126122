// codec/code_batch_wire.h: real batches of every mode and wire dtype round-trip bit-exactly (and
// decode to the same cache); every kind of malformed input is refused with its own clear error.
#include "codec/code_batch_wire.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "base/crc32c.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/transfer.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using testing::ExpectSameChunk;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class CodeBatchWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    artifact_ = testing::SyntheticArtifact(*model_);
    prompt_ = testing::LoadGolden("stories260k").prompts[2].ids;
  }
  CodeBatch Encode(TransferMode mode, WireDtype dtype, size_t tokens) {
    TransferOptions options;
    options.code_dtype = options.raw_dtype = dtype;
    TransferPlan plan =
        testing::Ok(TransferPlan::Make(mode, model_->config(), &artifact_, options));
    const std::vector<TokenId> prefix(prompt_.begin(), prompt_.begin() + tokens);
    return testing::Ok(CodeEncoder(plan, &artifact_, options).Prefill(*model_, prefix));
  }
  std::unique_ptr<LlamaModel> model_;
  Artifact artifact_;
  std::vector<TokenId> prompt_;
};

TEST_F(CodeBatchWireTest, EveryModeAndDtypeRoundTripsBitExactly) {
  const std::vector<TokenId> prefix(prompt_.begin(), prompt_.end() - 1);
  CodeDecoder decoder(*model_, &artifact_);
  for (TransferMode mode : kAllTransferModes) {
    for (WireDtype dtype :
         {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16, WireDtype::kInt8, WireDtype::kInt4}) {
      const std::string where = TransferModeName(mode) + "/" + WireDtypeName(dtype);
      CodeBatch batch = Encode(mode, dtype, prefix.size());
      const std::string bytes = SerializeCodeBatch(batch);
      absl::StatusOr<CodeBatch> parsed = ParseCodeBatch(bytes);
      ASSERT_TRUE(parsed.ok()) << where << ": " << parsed.status();
      EXPECT_EQ(parsed->mode, batch.mode);
      EXPECT_EQ(parsed->tokens, batch.tokens);
      ASSERT_EQ(parsed->chunks.size(), batch.chunks.size()) << where;
      for (size_t i = 0; i < batch.chunks.size(); ++i) {
        ExpectSameChunk(parsed->chunks[i], batch.chunks[i], where);
      }
      EXPECT_EQ(SerializeCodeBatch(*parsed), bytes) << where;
      // The consumer's cache from the parsed batch is the cache from the original, bit for bit.
      KvCache direct = model_->NewCache(64), wired = model_->NewCache(64);
      ASSERT_TRUE(decoder.Decode(batch, prefix, &direct).ok()) << where;
      ASSERT_TRUE(decoder.Decode(*parsed, prefix, &wired).ok()) << where;
      for (int l = 0; l < model_->config().num_layers; ++l) {
        EXPECT_TRUE(at::equal(direct.keys(l), wired.keys(l))) << where << " layer " << l;
        EXPECT_TRUE(at::equal(direct.values(l), wired.values(l))) << where << " layer " << l;
      }
    }
  }
}

TEST_F(CodeBatchWireTest, WireHandOffEqualsInProcess) {
  const std::vector<TokenId> prefix(prompt_.begin(), prompt_.end() - 1);
  auto path = TransferPath::Create(TransferMode::kScd, *model_, *model_, &artifact_, {});
  ASSERT_TRUE(path.ok()) << path.status();
  KvCache a = model_->NewCache(64), b = model_->NewCache(64);
  auto in_process = path->Run(prefix, &a, InProcessHandOff());
  auto wire = path->Run(prefix, &b, WireHandOff());
  ASSERT_TRUE(in_process.ok() && wire.ok());
  EXPECT_EQ(in_process->payload_bytes, wire->payload_bytes);
  for (int l = 0; l < model_->config().num_layers; ++l) {
    EXPECT_TRUE(at::equal(a.keys(l), b.keys(l)) && at::equal(a.values(l), b.values(l))) << l;
  }
}

// Byte offsets of the first chunk record of a raw-mode batch (rank-3 shapes), per the layout
// table in code_batch_wire.h.
constexpr size_t kVersion = 4, kMode = 6, kCount = 16, kChunk = 24;
constexpr size_t kLayer = kChunk + 4, kKind = kChunk + 8, kDtype = kChunk + 9;
constexpr size_t kTokenEnd = kChunk + 20, kShape = kChunk + 28, kPayload = kShape + 24 + 16;

void Reseal(std::string* bytes) {  // a valid header checksum over edited header fields
  const uint32_t crc = Crc32c(bytes->data(), 20);
  std::memcpy(bytes->data() + 20, &crc, 4);
}

TEST_F(CodeBatchWireTest, TruncationAtEveryLengthIsRefused) {
  const std::string bytes = SerializeCodeBatch(Encode(TransferMode::kRaw, WireDtype::kF16, 3));
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<CodeBatch> parsed = ParseCodeBatch(absl::string_view(bytes).substr(0, n));
    ASSERT_FALSE(parsed.ok()) << n;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << n << parsed.status();
    EXPECT_TRUE(Contains(parsed.status(), "truncated")) << n << parsed.status();
  }
}

TEST_F(CodeBatchWireTest, MalformedInputsHaveTheirOwnErrors) {
  const std::string good = SerializeCodeBatch(Encode(TransferMode::kRaw, WireDtype::kF16, 3));
  ASSERT_TRUE(ParseCodeBatch(good).ok());
  struct Case {
    const char* name;
    std::function<void(std::string*)> edit;
    absl::StatusCode code;
    const char* message;
  };
  auto put64 = [](std::string* b, size_t at, int64_t v) { std::memcpy(b->data() + at, &v, 8); };
  const std::vector<Case> cases = {
      {"payload byte", [](std::string* b) { (*b)[kPayload + 5] ^= 0x10; },
       absl::StatusCode::kDataLoss, "checksum mismatch"},
      {"chunk header byte", [](std::string* b) { (*b)[kLayer + 3] ^= 0x01; },
       absl::StatusCode::kDataLoss, "checksum mismatch"},
      {"batch header byte", [](std::string* b) { (*b)[kCount + 1] ^= 0x01; },
       absl::StatusCode::kDataLoss, "header checksum"},
      {"magic", [](std::string* b) { (*b)[0] = 'X'; }, absl::StatusCode::kDataLoss, "bad magic"},
      {"chunk magic", [](std::string* b) { (*b)[kChunk] = 'X'; }, absl::StatusCode::kDataLoss,
       "not a code chunk"},
      {"version",
       [](std::string* b) {
         (*b)[kVersion] = 9;
         Reseal(b);
       },
       absl::StatusCode::kFailedPrecondition, "version 9 is not supported"},
      {"mode",
       [](std::string* b) {
         (*b)[kMode] = 77;
         Reseal(b);
       },
       absl::StatusCode::kInvalidArgument, "unknown transfer mode 77"},
      {"kind", [](std::string* b) { (*b)[kKind] = 42; }, absl::StatusCode::kInvalidArgument,
       "unknown kind 42"},
      {"dtype", [](std::string* b) { (*b)[kDtype] = 9; }, absl::StatusCode::kInvalidArgument,
       "unknown wire dtype 9"},
      {"shape vs bytes", [&](std::string* b) { put64(b, kShape + 8, 2); },
       absl::StatusCode::kInvalidArgument, "data and 0 scale bytes but a f16 tensor"},
      {"zero dimension", [&](std::string* b) { put64(b, kShape, 0); },
       absl::StatusCode::kInvalidArgument, "dimension of 0"},
      {"token range", [&](std::string* b) { put64(b, kTokenEnd, 8); },
       absl::StatusCode::kInvalidArgument, "token range [0, 8)"},
      {"trailing bytes", [](std::string* b) { b->append("junk"); }, absl::StatusCode::kDataLoss,
       "4 bytes after its"},
      {"chunk count",
       [](std::string* b) {
         (*b)[kCount] += 1;
         Reseal(b);
       },
       absl::StatusCode::kDataLoss, "declares 11 chunks and holds 10"},
  };
  for (const Case& c : cases) {
    std::string bytes = good;
    c.edit(&bytes);
    absl::StatusOr<CodeBatch> parsed = ParseCodeBatch(bytes);
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_EQ(parsed.status().code(), c.code) << c.name << ": " << parsed.status();
    EXPECT_TRUE(Contains(parsed.status(), c.message)) << c.name << ": " << parsed.status();
  }
}

TEST_F(CodeBatchWireTest, UnpackRefusesInconsistentChunks) {
  CodeBatch batch = Encode(TransferMode::kRaw, WireDtype::kInt8, 3);
  CodeChunk chunk = batch.chunks[0];
  ASSERT_TRUE(UnpackTensor(chunk, at::kCPU).ok());
  chunk.shape = {1, 2, 3};  // fewer elements than the data holds
  absl::StatusOr<at::Tensor> bad = UnpackTensor(chunk, at::kCPU);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status(), "the shape needs")) << bad.status();
  chunk = batch.chunks[0];
  chunk.scales = at::Tensor();  // int8 without its scales
  EXPECT_EQ(UnpackTensor(chunk, at::kCPU).status().code(), absl::StatusCode::kInvalidArgument);
  // The decoder reports such a chunk instead of throwing.
  batch.chunks[1].shape = {4, 3, 1};
  KvCache cache = model_->NewCache(8);
  const std::vector<TokenId> prefix(prompt_.begin(), prompt_.begin() + 3);
  absl::Status s = CodeDecoder(*model_, nullptr).Decode(batch, prefix, &cache);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace scd
