// The kernel is compiled for AVX2 + FMA through function attributes (the rest of the build stays
// at the baseline ISA) and only called after the CPU says it has both. The pool's workers spin a
// little after each call before sleeping: a decode step calls it a few times per layer in quick
// succession, and a sleeping thread takes tens of microseconds to wake.
#include "model/skinny_gemm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/thread_name.h"
#include "model/compute_steps.h"
#include "model/cpu_simd.h"

namespace scd {
namespace {

// Below this many weights (N x K) a call stays on the calling thread: waking a worker costs more.
constexpr int64_t kParallelMinWeights = int64_t{1} << 16;
// How long an idle worker spins for the next call before it sleeps.
constexpr std::chrono::microseconds kSpin(50);

constexpr int64_t kBlock = 12;  // rows of W a block holds (in L1/L2 while every x tile passes)

struct Problem {
  const float* x;
  const float* w;
  const float* b;  // may be null
  float* y;
  int64_t M, K, N;
};

#if defined(__x86_64__)
// Outputs [n, n + NR) x [m, m + MR): NR rows of W against MR rows of x.
template <int NR, int MR>
__attribute__((target("avx2,fma"))) void Tile(const Problem& p, int64_t n, int64_t m) {
  const int64_t K = p.K, K8 = K & ~int64_t{7};
  __m256 acc[NR][MR];
  for (int i = 0; i < NR; ++i) {
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const float* w = p.w + n * K;
  const float* x = p.x + m * K;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR];
    for (int i = 0; i < NR; ++i) wv[i] = _mm256_loadu_ps(w + i * K + k);
    for (int j = 0; j < MR; ++j) {
      const __m256 xv = _mm256_loadu_ps(x + j * K + k);
      for (int i = 0; i < NR; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < NR; ++i) {
    for (int j = 0; j < MR; ++j) {
      float sum = Sum8(acc[i][j]);
      for (int64_t k = K8; k < K; ++k) sum += w[i * K + k] * x[j * K + k];
      if (p.b != nullptr) sum += p.b[n + i];
      p.y[(m + j) * p.N + n + i] = sum;
    }
  }
}

// Rows [n, n + nb) of W (nb <= kBlock) against rows [m, m + MR) of x: tiles of NR rows of W
// (NR x MR = 12 accumulators, enough independent chains to keep both FMA units busy), the rows
// left over one at a time. Every element's arithmetic is the same in every tile.
template <int NR, int MR>
__attribute__((target("avx2,fma"))) void Block(const Problem& p, int64_t n, int64_t nb,
                                               int64_t m) {
  int64_t i = 0;
  for (; i + NR <= nb; i += NR) Tile<NR, MR>(p, n + i, m);
  for (; i < nb; ++i) Tile<1, MR>(p, n + i, m);
}

// Asks for W's rows [n, n + rows) to be brought into L2 while the current block computes: with
// short rows (small K) the hardware prefetcher barely starts on a row before it ends, and a block
// of a few rows alone keeps too few cache misses in flight to stream W at the memory's rate.
__attribute__((target("avx2,fma"))) void Prefetch(const Problem& p, int64_t n, int64_t rows) {
  const char* begin = reinterpret_cast<const char*>(p.w + n * p.K);
  const char* end = reinterpret_cast<const char*>(p.w + (n + rows) * p.K);
  for (const char* line = begin; line < end; line += 64) _mm_prefetch(line, _MM_HINT_T1);
}

// Outputs for W's rows [n0, n1).
__attribute__((target("avx2,fma"))) void Range(const Problem& p, int64_t n0, int64_t n1) {
  if (p.M == 1) {
    // One row of x: W's rows one after another, a single sequential stream (no prefetch: the
    // hardware's stream prefetcher keeps up with one stream better than with a tile's 12;
    // bench/README.md, "Ahead of llama.cpp"). Each output is the same accumulation as in a tile.
    Block<1, 1>(p, n0, n1 - n0, 0);
    return;
  }
  for (int64_t n = n0; n < n1; n += kBlock) {
    const int64_t nb = std::min(kBlock, n1 - n);
    // Two blocks ahead (the next is on its way already; at the start, both).
    if (n == n0 && n + nb < n1) Prefetch(p, n + nb, std::min(kBlock, n1 - n - nb));
    const int64_t ahead = n + 2 * kBlock;
    if (ahead < n1) Prefetch(p, ahead, std::min(kBlock, n1 - ahead));
    int64_t m = 0;
    for (; m + 4 <= p.M; m += 4) Block<3, 4>(p, n, nb, m);
    for (; m + 2 <= p.M; m += 2) Block<6, 2>(p, n, nb, m);
    if (m < p.M) Block<12, 1>(p, n, nb, m);
  }
}
#else
void Range(const Problem&, int64_t, int64_t) {}  // never called: no AVX2 off x86-64
inline void _mm_pause() {}
#endif

// A pool of workers that run parts of one call beside the calling thread.
class Pool {
 public:
  ~Pool() { Resize(1); }

  void Resize(int threads) {
    std::lock_guard<std::mutex> run(run_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    threads_ = std::max(1, threads);
    for (int i = 1; i < threads_; ++i)
      workers_.emplace_back([this] {
        NameThisThread("scd-gemm");
        Work();
      });
  }
  int threads() const { return threads_; }

  // Runs `part` on the calling thread and on every worker that joins before the caller is done
  // with it; `part` must share the work out itself (it is called once per thread). The caller
  // never waits for a worker that has not started (a sleeping one takes tens of microseconds to
  // wake): it closes the call, and a worker arriving after that skips it. Another call in
  // progress (a step beside this one): the calling thread alone.
  template <typename Part>
  void Run(const Part& part) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock() || threads_ <= 1) {
      part();
      return;
    }
    const std::function<void()> task = part;
    uint64_t open = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      ++generation_;
      open = Gate(generation_, 1);
      gate_.store(open, std::memory_order_release);
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    part();
    // Close: wait for the workers inside, then let no one else in.
    for (uint64_t expected = open;
         !gate_.compare_exchange_weak(expected, open - 1, std::memory_order_acq_rel);
         expected = open) {
      _mm_pause();
    }
  }

 private:
  void Work() {
    uint64_t seen = 0;
    for (;;) {
      // Spin a little for the next call, then sleep.
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (int i = 1; published_.load(std::memory_order_acquire) == seen; ++i) {
        _mm_pause();
        if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
      const std::function<void()>* task = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      // Join the call read above if it is still open (the same generation, not closed).
      uint64_t state = gate_.load(std::memory_order_acquire);
      while (state >> 32 == (seen & 0xffffffffu) && (state & 0xffffffffu) > 0 &&
             !gate_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
      }
      if (state >> 32 != (seen & 0xffffffffu) || (state & 0xffffffffu) == 0) continue;
      (*task)();
      gate_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex run_mu_;  // one call at a time uses the workers
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  std::atomic<uint64_t> published_{0};
  bool stop_ = false;
  const std::function<void()>* task_ = nullptr;  // the open call's (guarded by mu_)
  // The call's generation (low 32 bits) << 32 | 1 + workers inside while it is open, 0 closed.
  std::atomic<uint64_t> gate_{0};
  static uint64_t Gate(uint64_t generation, uint64_t count) {
    return (generation & 0xffffffffu) << 32 | count;
  }
  int threads_ = 1;
  std::vector<std::thread> workers_;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: calls may run at exit
  return *pool;
}

}  // namespace

bool SkinnyGemmAvailable() { return CpuHasAvx2Fma(); }

void SkinnyParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 1 || ComputeStepsShared()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  ThePool().Run([&] {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  });
}

void SkinnyParallelChunks(int64_t n, int64_t min_chunk,
                          const std::function<void(int64_t, int64_t)>& fn) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  const int64_t parts = 2 * std::max(1, ThePool().threads());
  for (int64_t begin = 0; begin < n;) {
    const int64_t size = std::max(std::max<int64_t>(1, min_chunk), (n - begin) / parts);
    chunks.emplace_back(begin, std::min(n, begin + size));
    begin = chunks.back().second;
  }
  SkinnyParallelFor(static_cast<int64_t>(chunks.size()),
                    [&](int64_t i) { fn(chunks[i].first, chunks[i].second); });
}

bool SkinnyGemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor* y) {
  if (!CpuHasAvx2Fma() || !x.defined() || !w.defined()) return false;
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1)) return false;
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  if (M < 1 || K < 1 || N < 1 || (M > kSkinnyMaxRows && N * K > kSkinnySmallWeights)) {
    return false;
  }
  for (const at::Tensor* t : {&x, &w}) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || !t->is_contiguous()) {
      return false;
    }
  }
  if (b.defined() && (!b.device().is_cpu() || b.scalar_type() != at::kFloat || b.dim() != 1 ||
                      b.size(0) != N || !b.is_contiguous())) {
    return false;
  }
  at::Tensor out = at::empty({M, N}, x.options());
  const Problem p{x.data_ptr<float>(), w.data_ptr<float>(),
                  b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>(), M, K, N};
  if (N * K < kParallelMinWeights) {
    Range(p, 0, N);
  } else {
    // Slices of W's rows handed out one at a time to whichever thread comes: a worker that
    // starts late takes fewer, or none.
    if (M == 1) {
      // One row: guided chunks of W's rows, each thread streaming long runs of W.
      SkinnyParallelChunks(N, 4 * kBlock, [&](int64_t a, int64_t z) { Range(p, a, z); });
      *y = std::move(out);
      return true;
    }
    // More rows: short slices handed out one at a time, so a worker that starts late takes
    // fewer, or none.
    constexpr int64_t kSlice = 4 * kBlock;
    SkinnyParallelFor((N + kSlice - 1) / kSlice, [&](int64_t slice) {
      Range(p, slice * kSlice, std::min(N, (slice + 1) * kSlice));
    });
  }
  *y = std::move(out);
  return true;
}

void SetSkinnyThreads(int threads) { ThePool().Resize(threads); }

int SkinnyThreads() { return ThePool().threads(); }

}  // namespace scd
