// SkinnyGemm: y = x W^T (+ b) for the few rows of a decode step (x [M, K], M <= kSkinnyMaxRows)
// against a weight matrix W [N, K] stored row-major, float32 on a CPU.
//
// Why not BLAS: a decode step is memory-bound -- the point of batching it is that the weights are
// read once for every row. OpenBLAS packs W into its own layout on every call, and for a few rows
// that pass costs more than the arithmetic: on this project's 2-core VM a [8, 2048] x [2048,
// 11264] product took 2.5-3x one row's GEMV (TN layout) and 1.6-2x with W stored transposed, and
// BLIS's unpacked small-matrix path and oneDNN (libtorch's mkldnn_linear) did no better
// (bench/README.md, "Batched decode"). This kernel streams W once, in its own row order: tiles of
// 3 rows of W (read from memory once) against 4 rows of x at a time (from cache), 12 eight-lane
// accumulators over k, AVX2 + FMA, chosen at run time (a CPU without them uses BLAS).
//
// Batch invariance: every output element is one accumulation over k in order in its own vector
// register, then a fixed horizontal sum, the k % 8 tail in order, and the bias. Its value does not
// depend on how many rows are computed with it, in which tile, on which thread: a sequence's
// projections are bit-identical alone or in any batch.
//
// Threads: W's rows are split between the calling thread and the workers of a process-wide pool
// (SetSkinnyThreads; ConfigureThreads gives it the compute threads), for matrices large enough to
// be worth waking them; while model steps run side by side (model/compute_steps.h) each call runs
// on its own thread, as BLAS calls then do.
//
// Thread-safety: SkinnyGemm is reentrant; SetSkinnyThreads is called at start-up.
#ifndef SCD_MODEL_SKINNY_GEMM_H_
#define SCD_MODEL_SKINNY_GEMM_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace scd {

// The most rows SkinnyGemm takes: a step's decodes and a prefill chunk beside them. Measured on the
// 2-core VM against OpenBLAS for TinyLlama's gate|up projection, it stays ahead up to 64 rows
// (26 ms against 53); a whole prompt's prefill goes to BLAS's packed GEMM.
inline constexpr int64_t kSkinnyMaxRows = 64;
// A matrix this small (N x K weights, 1 MiB in float32) stays in L2 while any number of rows pass
// over it: SkinnyGemm takes it for every row count. OpenBLAS splits such products between its
// threads and wakes them for a few microseconds of work each: a 150-token prefill of a 260k-weight
// model took 8-30 ms that way, mostly threads waking and yielding (bench/README.md).
inline constexpr int64_t kSkinnySmallWeights = int64_t{1} << 18;

// Whether this CPU runs the kernel (AVX2 and FMA).
bool SkinnyGemmAvailable();

// y = x W^T + b (b may be undefined). Returns false and leaves *y alone when the kernel does not
// apply: no AVX2/FMA, not float32 on the CPU, x not [M, K] with M >= 1 and M <= kSkinnyMaxRows
// unless N x K <= kSkinnySmallWeights, W not [N, K], either not contiguous, b not [N].
bool SkinnyGemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor* y);

// Runs fn(i) for every i in [0, n) on the calling thread and on the pool's workers that come in
// time (items handed out one at a time), as SkinnyGemm shares its rows: for per-sequence work of
// a decode step (model/llama_model.cc: attention of the decode rows). Each item runs on one thread
// whole, so its result does not depend on the split. Calling-thread only while model steps run
// side by side (model/compute_steps.h) or for a single item. Returns when every item ran.
// REQUIRES: fn does not throw (a worker has nowhere to send it).
void SkinnyParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

// Runs fn(begin, end) over [0, n) in "guided" chunks handed out one at a time: each chunk
// 1 / (2 threads) of what is left, at least `min_chunk` -- long runs first (a thread streams each
// as one sequential read), short ones last, so the threads finish together. Same rules as
// SkinnyParallelFor.
void SkinnyParallelChunks(int64_t n, int64_t min_chunk,
                          const std::function<void(int64_t begin, int64_t end)>& fn);

// Threads a call may use (>= 1; the calling thread counts). Starts or stops pool workers.
void SetSkinnyThreads(int threads);
int SkinnyThreads();

}  // namespace scd

#endif  // SCD_MODEL_SKINNY_GEMM_H_
