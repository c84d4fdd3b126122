// Token rows of a wire chunk: slicing a CodeChunk to a range of its positions and joining
// chunks of consecutive ranges, on the packed bytes, without decoding. A chunk's logical shape
// is [..., T, C] (positions in the second-to-last dimension: [kv_heads, T, r] for K/V and their
// codes, [T, d] for hidden codes and states); its wire form is row-separable when every
// position's values are packed on their own: f32, f16 and bf16 always, int8 too (one scale per
// row of C values), int4 when C is a multiple of its 32-value groups. Then slicing and joining
// give exactly the bytes PackTensor gives for the sliced or joined values, so a prefix cache can
// keep packed codes per block and serve any run of blocks.
// Thread-safety: stateless functions.
#ifndef SCD_CODEC_CHUNK_ROWS_H_
#define SCD_CODEC_CHUNK_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/code_batch.h"

namespace scd {

// Whether a chunk of `dtype` and logical `shape` can be cut between positions.
bool RowSeparable(WireDtype dtype, const std::vector<int64_t>& shape);

// Positions [begin, end) of `chunk` (absolute, inside [chunk.token_begin, chunk.token_end)),
// as a chunk of compact tensors (model/tensor_memory.h): it holds its rows alone. InvalidArgument:
// not row-separable, a range outside the chunk, tensors that do not match the shape.
absl::StatusOr<CodeChunk> SliceChunkRows(const CodeChunk& chunk, int64_t begin, int64_t end);

// `parts` (at least one) joined along positions: the same layer, kind, dtype and shape but for
// positions, each starting where the previous ends. InvalidArgument otherwise.
absl::StatusOr<CodeChunk> JoinChunkRows(const std::vector<const CodeChunk*>& parts);

// A code chunk cut to its first `rank` columns (the last dimension): the nested codes' lower
// rank (codec/reuse_translator.h), what a producer sends when the link falls behind
// (codec/rank_governor.h). f32, f16 and bf16 columns are sliced as they are (the chunk an encode
// at `rank` gives); int8 and int4 are dequantized, cut and quantized again (one more rounding
// step). InvalidArgument for kinds that are not codes, a rank outside [1, columns], tensors that
// do not match the shape.
absl::StatusOr<CodeChunk> LowerChunkRank(const CodeChunk& chunk, int64_t rank);

// Pieces of positions of one code (`parts`, consecutive, as JoinChunkRows) that may have come at
// different nested ranks (an adapting producer lowers each piece to what the link allows): the
// whole code at the highest of their ranks. One piece is the code itself; pieces of one rank
// packed per position are joined as they are (their dtype); otherwise (several ranks, or int4 of
// a rank its groups do not divide) every piece is unpacked (dequantized), its missing columns
// are zeros -- the nested code at its lower rank, decoded the same -- and the whole travels on
// as f32, exact for every wire dtype. InvalidArgument: pieces that do not follow one another,
// of other layers, kinds or shapes, or a kind that is not a code.
absl::StatusOr<CodeChunk> JoinMixedRankRows(const std::vector<const CodeChunk*>& parts);

}  // namespace scd

#endif  // SCD_CODEC_CHUNK_ROWS_H_
