// Chunk rows: slicing a packed chunk to positions and joining slices give exactly PackTensor's
// bytes for the same values (the reference: packing the sliced float tensor itself), for every
// row-separable wire dtype and both chunk shapes; what is not separable or does not fit is refused.
#include "codec/chunk_rows.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>

namespace scd {
namespace {

CodeChunk Packed(const at::Tensor& values, WireDtype dtype, int64_t token_begin) {
  CodeChunk chunk = PackTensor(values, dtype);
  chunk.layer = 3;
  chunk.kind = PayloadKind::kKeyCode;
  const int64_t T = values.size(values.dim() - 2);
  chunk.token_begin = token_begin;
  chunk.token_end = token_begin + T;
  return chunk;
}

void ExpectSameWire(const CodeChunk& got, const CodeChunk& want, const std::string& what) {
  EXPECT_EQ(got.shape, want.shape) << what;
  EXPECT_EQ(got.token_begin, want.token_begin) << what;
  EXPECT_EQ(got.token_end, want.token_end) << what;
  EXPECT_EQ(got.bytes(), want.bytes()) << what;
  EXPECT_TRUE(at::equal(got.data.reshape({-1}), want.data.reshape({-1}))) << what << ": data";
  ASSERT_EQ(got.scales.defined(), want.scales.defined()) << what;
  if (want.scales.defined()) {
    EXPECT_TRUE(at::equal(got.scales.reshape({-1}), want.scales.reshape({-1})))
        << what << ": scales";
  }
  EXPECT_TRUE(CheckChunkTensors(got).ok()) << what;
}

class ChunkRowsTest
    : public ::testing::TestWithParam<std::tuple<WireDtype, std::vector<int64_t>>> {};

TEST_P(ChunkRowsTest, SlicesAndJoinsEqualPackingTheValues) {
  const auto& [dtype, shape] = GetParam();
  at::manual_seed(7);
  const at::Tensor x = at::randn(shape) * 3;
  const int64_t dim = x.dim() - 2, T = x.size(dim), first = 32;  // positions [32, 32 + T)
  const CodeChunk whole = Packed(x, dtype, first);
  ASSERT_TRUE(RowSeparable(dtype, whole.shape));
  // Blocks of 16 and a short tail, as a prefix cache cuts them.
  std::vector<CodeChunk> parts;
  for (int64_t b = 0; b < T; b += 16) {
    const int64_t e = std::min(T, b + 16);
    auto slice = SliceChunkRows(whole, first + b, first + e);
    ASSERT_TRUE(slice.ok()) << slice.status();
    ExpectSameWire(*slice, Packed(x.narrow(dim, b, e - b), dtype, first + b),
                   "slice " + std::to_string(b));
    parts.push_back(*std::move(slice));
  }
  std::vector<const CodeChunk*> pointers;
  for (const CodeChunk& part : parts) pointers.push_back(&part);
  auto joined = JoinChunkRows(pointers);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ExpectSameWire(*joined, whole, "joined");
  // And what a consumer decodes from the joined chunk is the whole chunk's.
  auto a = UnpackTensor(*joined, at::kCPU), b = UnpackTensor(whole, at::kCPU);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b));
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, ChunkRowsTest,
    ::testing::Combine(::testing::Values(WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16,
                                         WireDtype::kInt8, WireDtype::kInt4),
                       ::testing::Values(std::vector<int64_t>{4, 40, 64},
                                         std::vector<int64_t>{37, 96})));

TEST(ChunkRowsRefusals, Int4RowsThatShareAGroupAndRangesOutside) {
  const at::Tensor x = at::randn({2, 20, 16});
  EXPECT_FALSE(RowSeparable(WireDtype::kInt4, {2, 20, 16}));
  EXPECT_TRUE(RowSeparable(WireDtype::kInt8, {2, 20, 16}));
  const CodeChunk int4 = Packed(x, WireDtype::kInt4, 0);
  auto refused = SliceChunkRows(int4, 0, 16);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not packed per position"), std::string::npos);

  const CodeChunk f16 = Packed(x, WireDtype::kF16, 16);
  EXPECT_FALSE(SliceChunkRows(f16, 0, 16).ok());   // before the chunk
  EXPECT_FALSE(SliceChunkRows(f16, 30, 40).ok());  // past its end
  EXPECT_FALSE(SliceChunkRows(f16, 20, 20).ok());  // empty
  EXPECT_FALSE(JoinChunkRows({}).ok());
  // A gap, another kind, another dtype.
  auto a = SliceChunkRows(f16, 16, 20), c = SliceChunkRows(f16, 24, 36);
  ASSERT_TRUE(a.ok() && c.ok());
  EXPECT_FALSE(JoinChunkRows({&*a, &*c}).ok());
  CodeChunk other = *c;
  other.token_begin = 20;
  other.token_end = 32;
  other.kind = PayloadKind::kValueCode;
  EXPECT_FALSE(JoinChunkRows({&*a, &other}).ok());
  CodeChunk wrong_shape = f16;
  wrong_shape.shape = {2, 19, 16};  // positions the shape does not hold
  EXPECT_FALSE(SliceChunkRows(wrong_shape, 16, 20).ok());
}

TEST_P(ChunkRowsTest, LoweredRankIsPackingTheFirstColumns) {
  const auto& [dtype, shape] = GetParam();
  at::manual_seed(11);
  const at::Tensor x = at::randn(shape) * 3;
  const CodeChunk whole = Packed(x, dtype, 8);
  const int64_t columns = x.size(-1), rank = columns / 4;
  auto lowered = LowerChunkRank(whole, rank);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  if (dtype == WireDtype::kInt8 || dtype == WireDtype::kInt4) {
    // Quantized codes are cut from what the consumer would decode, then packed again.
    const at::Tensor decoded = *UnpackTensor(whole, at::kCPU);
    ExpectSameWire(*lowered, Packed(decoded.narrow(-1, 0, rank), dtype, 8), "lowered");
  } else {
    ExpectSameWire(*lowered, Packed(x.narrow(-1, 0, rank), dtype, 8), "lowered");
  }
  EXPECT_EQ(lowered->layer, whole.layer);
  EXPECT_EQ(lowered->kind, whole.kind);
  auto same = LowerChunkRank(whole, columns);  // the full rank: the chunk itself
  ASSERT_TRUE(same.ok());
  ExpectSameWire(*same, whole, "full rank");
  EXPECT_FALSE(LowerChunkRank(whole, 0).ok());
  EXPECT_FALSE(LowerChunkRank(whole, columns + 1).ok());
  CodeChunk raw = whole;
  raw.kind = PayloadKind::kRawKey;  // raw K/V have no nested rank
  EXPECT_FALSE(LowerChunkRank(raw, rank).ok());
}

TEST_P(ChunkRowsTest, PiecesAtDifferentRanksJoinAsTheCodeZeroPaddedToTheHighest) {
  const auto& [dtype, shape] = GetParam();
  at::manual_seed(12);
  const at::Tensor x = at::randn(shape) * 3;
  const CodeChunk whole = Packed(x, dtype, 8);
  const int64_t T = x.size(-2), columns = x.size(-1), low = columns / 4;
  // Positions [8, 8 + T/2) at the full rank, the rest at `low`.
  const CodeChunk head = *SliceChunkRows(whole, 8, 8 + T / 2);
  const CodeChunk tail = *LowerChunkRank(*SliceChunkRows(whole, 8 + T / 2, 8 + T), low);
  auto joined = JoinMixedRankRows({&head, &tail});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->dtype, WireDtype::kF32);
  // The reference: what the consumer decodes from each piece, the tail's missing columns zero.
  at::Tensor want = *UnpackTensor(whole, at::kCPU);
  want.narrow(-2, T / 2, T - T / 2).copy_(at::constant_pad_nd(*UnpackTensor(tail, at::kCPU),
                                                               {0, columns - low}));
  EXPECT_TRUE(at::equal(*UnpackTensor(*joined, at::kCPU), want));
  EXPECT_EQ(joined->token_begin, 8);
  EXPECT_EQ(joined->token_end, 8 + T);
  // Pieces of one rank: joined as they are, in their own dtype.
  const CodeChunk tail_full = *SliceChunkRows(whole, 8 + T / 2, 8 + T);
  auto same = JoinMixedRankRows({&head, &tail_full});
  ASSERT_TRUE(same.ok()) << same.status();
  ExpectSameWire(*same, whole, "one rank");
  // Both pieces lowered to one rank (int4: a rank its groups do not divide, packed across
  // positions): the code at that rank, decoded the same.
  const CodeChunk head_low = *LowerChunkRank(head, low);
  auto both_low = JoinMixedRankRows({&head_low, &tail});
  ASSERT_TRUE(both_low.ok()) << both_low.status();
  const at::Tensor low_want =
      at::cat({*UnpackTensor(head_low, at::kCPU), *UnpackTensor(tail, at::kCPU)}, -2);
  EXPECT_TRUE(at::equal(*UnpackTensor(*both_low, at::kCPU), low_want));
  // One piece, the whole code at a lower rank: itself.
  const CodeChunk whole_low = *LowerChunkRank(whole, low);
  auto single = JoinMixedRankRows({&whole_low});
  ASSERT_TRUE(single.ok()) << single.status();
  ExpectSameWire(*single, whole_low, "one piece");
  // Out of order, or not a code: refused.
  EXPECT_FALSE(JoinMixedRankRows({&tail, &head}).ok());
  CodeChunk raw = head;
  raw.kind = PayloadKind::kRawKey;
  EXPECT_FALSE(JoinMixedRankRows({&raw, &tail}).ok());
}

}  // namespace
}  // namespace scd
