// DecodeAttention: one new token's grouped-query attention against its own sequence's cache, on a
// CPU in float32 -- the decode rows of a batched step (model/llama_model.h).
//
// Why not ATen's bmm: for one query row per kv head the product is a few thousand multiply-adds,
// and OpenBLAS packs both operands on every call; with the softmax and the second product that
// was about a fifth of a tinystories-4m decode step of 8 sequences, spent per sequence and layer
// (perf, bench/README.md "Batched decode"). This runs the scores, the softmax and the weighted sum
// of values straight from the cache's memory in one call, eight lanes at a time (AVX2 + FMA,
// chosen at run time; otherwise, or for a head size that is not a multiple of 8, the caller uses
// ATen). The exponentials are a vectorised polynomial (Cephes' expf, within 2 ulps of std::exp,
// eight scores at a time: they were a third of the kernel's time as std::exp calls); results
// agree with ATen's to float32 rounding.
//
// A row's result depends only on its own query and cache: bit-identical alone or in any batch.
// Thread-safety: reentrant.
#ifndef SCD_MODEL_DECODE_ATTENTION_H_
#define SCD_MODEL_DECODE_ATTENTION_H_

#include <ATen/core/Tensor.h>

namespace scd {

// One decode row's attention on memory (no tensor per row: the batched step calls this per
// sequence and layer): per kv head h, the `group` query rows q[h] (already scaled) against the
// `length` keys and values of that head, written to out[h].
struct DecodeAttentionArgs {
  const float* q = nullptr;       // [kv_heads, group, head_dim], contiguous
  const float* keys = nullptr;    // head 0's first visible key; rows head_dim apart
  const float* values = nullptr;  // likewise
  int64_t head_stride = 0;        // floats between heads in keys and values
  int64_t kv_heads = 0, group = 0, head_dim = 0, length = 0;
  float* out = nullptr;           // [kv_heads, group, head_dim], contiguous
};

// Whether the kernel runs here for this head size (AVX2 + FMA, head_dim a multiple of 8).
bool DecodeAttentionAvailable(int64_t head_dim);
// REQUIRES: DecodeAttentionAvailable(args.head_dim), length >= 1.
void DecodeAttention(const DecodeAttentionArgs& args);

}  // namespace scd

#endif  // SCD_MODEL_DECODE_ATTENTION_H_
