// GgufWriter (model/gguf_writer.h): encodings as ggml defines them, computed here from the
// definitions (Q8_0: d = max|x| / 127 as f16, q = round(x / d) away from zero), the file's layout
// (header, typed metadata, tensor descriptions, 32-byte aligned data) parsed back by this test
// byte by byte, and what it refuses. tests/gguf_export_test.cc reads whole exports back with
// llama.cpp's side (node-llama-cpp's GGUF parser) and tests/peer_greedy_test.cc runs them.
#include "model/gguf_writer.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace scd {
namespace {

template <typename T>
T At(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

TEST(GgufWriterTest, Q8_0BlocksFollowGgmlsReferenceQuantizer) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.37f * i) * (i < 32 ? 1.0f : 0.01f);
  x[5] = -2.5f;  // the first block's largest magnitude, negative
  std::string out;
  EncodeGgml(GgmlType::kQ8_0, x, &out);
  ASSERT_EQ(out.size(), 2u * 34u);
  ASSERT_EQ(GgmlBytes(GgmlType::kQ8_0, 64), 68u);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.0f;
    EXPECT_EQ(At<uint16_t>(out, 34 * b), c10::Half(d).x) << "block " << b;
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(At<int8_t>(out, 34 * b + 2 + i), static_cast<int8_t>(std::roundf(x[32 * b + i] / d)))
          << "block " << b << " value " << i;
    }
  }
  EXPECT_EQ(At<int8_t>(out, 2 + 5), -127);  // the largest magnitude lands on -127
}

TEST(GgufWriterTest, HalfEncodingsRoundToNearestEven) {
  const std::vector<float> x = {1.0f, -3.140625f, 65504.0f, 1e-8f, 0.1f};
  std::string f16, bf16;
  EncodeGgml(GgmlType::kF16, x, &f16);
  EncodeGgml(GgmlType::kBF16, x, &bf16);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(At<uint16_t>(f16, 2 * i), c10::Half(x[i]).x);
    EXPECT_EQ(At<uint16_t>(bf16, 2 * i), c10::BFloat16(x[i]).x);
  }
  EXPECT_EQ(At<uint16_t>(bf16, 0), 0x3F80);  // 1.0 in bf16
  EXPECT_EQ(At<uint16_t>(f16, 0), 0x3C00);   // 1.0 in f16
}

TEST(GgufWriterTest, TheFileIsHeaderMetadataDescriptionsThenAlignedData) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 7);
  w.SetFloat32Array("scores", {0.5f, -1.0f});
  w.AddTensor("a", {2, 3}, GgmlType::kF32, [](std::vector<float>* v) {
    *v = {1, 2, 3, 4, 5, 6};
  });
  w.AddTensor("b", {1, 32}, GgmlType::kQ8_0, [](std::vector<float>* v) { v->assign(32, 0.5f); });
  testing::TempDir dir;
  ASSERT_TRUE(w.Write(dir.File("x.gguf")).ok());
  const std::string f = testing::ReadFile(dir.File("x.gguf"));
  size_t o = 0;
  auto u32 = [&] { o += 4; return At<uint32_t>(f, o - 4); };
  auto u64 = [&] { o += 8; return At<uint64_t>(f, o - 8); };
  auto str = [&] { const uint64_t n = u64(); o += n; return f.substr(o - n, n); };
  EXPECT_EQ(std::string(f.data(), 4), "GGUF");
  o = 4;
  EXPECT_EQ(u32(), 3u);  // version
  EXPECT_EQ(u64(), 2u);  // tensors
  EXPECT_EQ(u64(), 3u);  // metadata pairs
  EXPECT_EQ(str(), "general.architecture");
  EXPECT_EQ(u32(), 8u);  // string
  EXPECT_EQ(str(), "llama");
  EXPECT_EQ(str(), "llama.block_count");
  EXPECT_EQ(u32(), 4u);  // uint32
  EXPECT_EQ(u32(), 7u);
  EXPECT_EQ(str(), "scores");
  EXPECT_EQ(u32(), 9u);  // array
  EXPECT_EQ(u32(), 6u);  // of float32
  EXPECT_EQ(u64(), 2u);
  o += 8;
  EXPECT_EQ(str(), "a");
  EXPECT_EQ(u32(), 2u);  // dims, innermost first
  EXPECT_EQ(u64(), 3u);
  EXPECT_EQ(u64(), 2u);
  EXPECT_EQ(u32(), 0u);  // F32
  EXPECT_EQ(u64(), 0u);  // offset
  EXPECT_EQ(str(), "b");
  EXPECT_EQ(u32(), 2u);
  EXPECT_EQ(u64(), 32u);
  EXPECT_EQ(u64(), 1u);
  EXPECT_EQ(u32(), 8u);   // Q8_0
  EXPECT_EQ(u64(), 32u);  // 24 bytes of "a", aligned to 32
  const size_t data = (o + 31) / 32 * 32;
  EXPECT_EQ(At<float>(f, data + 4 * 5), 6.0f);
  EXPECT_EQ(At<uint16_t>(f, data + 32), c10::Half(0.5f / 127.0f).x);
  EXPECT_EQ(At<int8_t>(f, data + 34), 127);
  EXPECT_EQ(f.size(), data + 32 + 64);  // 34 bytes of "b", padded to 32 bytes twice
}

TEST(GgufWriterTest, RefusesQ8_0RowsThatAreNotBlocksAndWrongValueCounts) {
  testing::TempDir dir;
  GgufWriter rows;
  rows.AddTensor("w", {2, 40}, GgmlType::kQ8_0, [](std::vector<float>* v) { v->assign(80, 1); });
  const absl::Status s = rows.Write(dir.File("rows.gguf"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s;
  GgufWriter count;
  count.AddTensor("w", {2, 4}, GgmlType::kF32, [](std::vector<float>* v) { v->assign(7, 1); });
  EXPECT_EQ(count.Write(dir.File("count.gguf")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.File("count.gguf")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("count.gguf.tmp")));
}

}  // namespace
}  // namespace scd
