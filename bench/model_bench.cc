// Prefill and decode speed of the runtime on dummy-weight models shaped like real ones, next to
// the GFLOP/s of a plain torch::mm of the model's dominant GEMM measured in the same run (this
// machine is shared and noisy, so only same-run ratios mean anything).
//
//   build/bin/scd_model_bench [--configs DIR] [--threads N] [--aten-threads N] [--quick]
//                             [benchmark flags]
//   build/bin/scd_model_bench --decode-report   read bandwidth, then decode before/after the
//                                               GEMV + workspace decode path, in one run
//   build/bin/scd_model_bench --batch-report    batched decode steps against per-sequence ones
//                                               and the attention layouts (bench/batch_report.h)
//       [--device cuda] [--dtype f32,bf16] [--layers N] [--context N]
//                                               on a GPU, in these dtypes, TinyLlama cut to N
//                                               layers (0: all; default 4), N-token contexts
//                                               (default 128)
//
// Against the machine, not only against itself: before the benchmarks it prints the CPU's FP32
// peak estimate and the speed of each prefill's dominant GEMM under every OpenBLAS kernel this CPU
// can run (each in a child process: --gemm-probe), and the summary shows prefill as a share of
// the best kernel's GEMM as well as of the GEMM of the kernel in use ("% of mm").
//
// DIR defaults to ../shared/configs. Shapes: tinyllama-1.1b cut to 4 layers, mistral-7b-v0.1 cut to
// 2 layers; T = 128, 512, 2048. --quick runs only T = 128 and 512 (for smoke tests).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/shared_dir.h"
#include "bench/batch_report.h"
#include "bench/flops.h"
#include "bench/machine_limits.h"
#include "model/blas_kernel.h"
#include "model/llama_model.h"
#include "model/runtime.h"

namespace scd {
namespace {

struct Shape {
  std::string name;
  std::string file;
  int layers;
};

struct Row {
  double mm_gflops = 0, prefill_gflops = 0, pct_of_mm = 0, prefill_tps = 0, decode_tps = 0,
         decode_gflops = 0;
  double best_gflops = 0;  // the dominant GEMM under the best kernel this CPU runs (child process)
  std::string best_core;
};
std::map<std::pair<std::string, int64_t>, Row>& Results() {
  static std::map<std::pair<std::string, int64_t>, Row> results;
  return results;
}

std::vector<TokenId> Prompt(int64_t n, int64_t vocab) {
  std::vector<TokenId> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<TokenId>((i * 7919 + 13) % vocab);
  return ids;
}

double Seconds(const std::function<void()>& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Each iteration times a prefill of T tokens and, right before it, torch::mm of the model's
// dominant GEMM (the fused gate|up projection, [T, d] x [d, 2f], in the layout the model uses)
// repeated to about the same FLOPs. Neighbouring measurements see the same machine load, so
// the per-iteration ratio is the number to trust; its median is reported.
void BM_Prefill(benchmark::State& state, const LlamaModel* model) {
  const int64_t T = state.range(0);
  const ModelConfig& c = model->config();
  const std::vector<TokenId> prompt = Prompt(T, c.vocab_size);
  const double prefill_flops = ForwardFlops(c, T, 0, /*logits_rows=*/1);
  at::Tensor x = at::randn({T, c.hidden_size});
  const at::Tensor& w = model->weights().layers[0].w_gate_up;
  const double mm_flops = 2.0 * T * c.hidden_size * w.size(0);
  const int mm_reps = std::max(1, static_cast<int>(prefill_flops / mm_flops + 0.5));
  std::vector<double> prefill_rate, mm_rate, ratio;
  for (auto _ : state) {
    const double mm_s = Seconds([&] {
      for (int i = 0; i < mm_reps; ++i) benchmark::DoNotOptimize(at::mm(x, w.t()));
    });
    absl::Status status;
    const double prefill_s = Seconds([&] {
      KvCache cache = model->NewCache(T);
      auto out = model->Forward(prompt, &cache);
      status = out.status();
      if (out.ok()) benchmark::DoNotOptimize(out->logits);
    });
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
    state.SetIterationTime(prefill_s);
    mm_rate.push_back(mm_flops * mm_reps / mm_s * 1e-9);
    prefill_rate.push_back(prefill_flops / prefill_s * 1e-9);
    ratio.push_back(prefill_rate.back() / mm_rate.back());
  }
  state.counters["GFLOP/s"] = Median(prefill_rate);
  state.counters["mm_GFLOP/s"] = Median(mm_rate);
  state.counters["pct_of_mm"] = 100 * Median(ratio);
  state.counters["tokens/s"] = T * Median(prefill_rate) / (prefill_flops * 1e-9);
}

// One decode step after a T-token context (the cache is truncated back after each step).
void BM_Decode(benchmark::State& state, const LlamaModel* model) {
  // The context is capped one short of the position limit so the step itself fits.
  const int64_t T = std::min<int64_t>(state.range(0), model->config().max_position_embeddings - 1);
  const std::vector<TokenId> prompt = Prompt(T, model->config().vocab_size);
  KvCache cache = model->NewCache(T + 1);
  if (!model->Forward(prompt, &cache, {.logits = LogitsMode::kNone}).ok()) {
    state.SkipWithError("prefill failed");
    return;
  }
  const TokenId next[] = {5};
  for (auto _ : state) {
    auto out = model->Forward(next, &cache);
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(out->logits);
    state.PauseTiming();
    if (!cache.Truncate(T).ok()) {
      state.SkipWithError("cache truncation failed");
      return;
    }
    state.ResumeTiming();
  }
  const double flops = ForwardFlops(model->config(), 1, T, 1);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

// Collects the counters into the summary table printed after the run.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      // Names look like "prefill/tinyllama-1.1b-4L/512/min_time:2.000/real_time".
      const std::vector<std::string> parts = absl::StrSplit(run.benchmark_name(), '/');
      int64_t T = 0;
      if (parts.size() < 3 || !absl::SimpleAtoi(parts[2], &T)) continue;
      const std::string& kind = parts[0];
      const std::string& model = parts[1];
      Row& row = Results()[{model, T}];
      auto counter = [&](const char* key) {
        auto it = run.counters.find(key);
        return it == run.counters.end() ? 0.0 : it->second.value;
      };
      if (kind == "prefill") {
        row.prefill_gflops = counter("GFLOP/s");
        row.mm_gflops = counter("mm_GFLOP/s");
        row.pct_of_mm = counter("pct_of_mm");
        row.prefill_tps = counter("tokens/s");
      }
      if (kind == "decode") {
        row.decode_gflops = counter("GFLOP/s");
        row.decode_tps = counter("tokens/s");
      }
    }
  }
};

// ---- --decode-report: decode before/after the decode-path work, next to read bandwidth ----

// Decode tokens/s: `steps` single-token steps after a 128-token context.
double DecodeTokensPerSecond(const LlamaModel& model, bool workspace, int steps) {
  const std::vector<TokenId> prompt = Prompt(128, model.config().vocab_size);
  KvCache cache = model.NewCache(128 + steps);
  const DecodeWorkspace ws = model.NewWorkspace(128 + steps);
  ForwardOptions options;
  if (workspace) options.workspace = &ws;
  if (!model.Forward(prompt, &cache, {.logits = LogitsMode::kNone}).ok()) return 0;
  const TokenId next[] = {5};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    if (!model.Forward(next, &cache, options).ok()) return 0;
  }
  return steps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int DecodeReport(const std::string& configs) {
  at::Tensor big = at::ones({int64_t{1} << 28});  // 1 GiB of f32
  const double sum_gbps = big.nbytes() / BestSeconds(5, [&] { at::sum(big); }) / 1e9;
  big = at::Tensor();
  const double mv_gbps = MvReadGbps();
  auto config = ModelConfig::FromFile(configs + "/tinyllama-1.1b.json");
  if (!config.ok()) {
    std::fprintf(stderr, "scd_model_bench: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  config->num_layers = 4;
  LlamaModel::Options before_options;
  before_options.gemv_single_rows = false;  // the decode path before: one-row GEMMs
  auto before = LlamaModel::Dummy(*config, 1, before_options);
  auto after = LlamaModel::Dummy(*config, 1, {});
  const double gb_per_token = WeightBytes(*after) / 1e9;
  std::vector<double> b, a;
  for (int round = 0; round < 5; ++round) {  // interleaved: both see the same machine state
    b.push_back(DecodeTokensPerSecond(*before, /*workspace=*/false, 16));
    a.push_back(DecodeTokensPerSecond(*after, /*workspace=*/true, 16));
  }
  const double bt = Median(b), at_ = Median(a);
  std::printf("read bandwidth: at::sum over 1 GiB %.1f GB/s, at::mv 4096x16384 f32 %.1f GB/s\n",
              sum_gbps, mv_gbps);
  std::printf(
      "decode, tinyllama-1.1b cut to 4 layers, f32, %.2f GB of weights per token, after "
      "a 128-token context (median of 5 interleaved rounds of 16 steps):\n",
      gb_per_token);
  std::printf("%-44s %9s %11s %12s\n", "path", "tokens/s", "weights GB/s", "% of at::mv");
  std::printf("%-44s %9.2f %11.1f %11.0f%%\n", "before: one-row GEMMs, tables per step", bt,
              bt * gb_per_token, 100 * bt * gb_per_token / mv_gbps);
  std::printf("%-44s %9.2f %11.1f %11.0f%%\n", "after: GEMV rows, per-sequence workspace", at_,
              at_ * gb_per_token, 100 * at_ * gb_per_token / mv_gbps);
  std::printf("speed-up (same run): %.2fx\n", at_ / bt);
  return 0;
}

// The machine's limits, printed before the benchmarks: the FP32 peak estimate, then each
// prefill's dominant GEMM ([T, d] x [d, 2f]) under every OpenBLAS kernel this CPU runs (child
// processes); the best of them goes into the summary rows.
void MeasureMachine(const std::vector<Shape>& shapes, const std::vector<int64_t>& lengths,
                    const std::vector<std::unique_ptr<LlamaModel>>& models, int threads) {
  const PeakEstimate peak = EstimateFp32Peak();
  std::printf("CPU FP32 peak estimate: %s\n", peak.Describe().c_str());
  std::printf(
      "  (cores: CPUs this process may use / SMT siblings; units: 2 FMA units per core "
      "assumed for AVX2/AVX-512; clock: measured with a chain of dependent adds)\n");
  const std::string in_use = OpenBlasCoreInUse();
  std::printf("BLAS kernel: %s\n", BlasKernelReport().c_str());
  if (in_use.empty()) return;
  std::vector<GemmShape> gemms;
  std::map<std::string, std::pair<std::string, int64_t>> rows;  // gemm key -> summary row
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ModelConfig& c = models[i]->config();
    for (int64_t T : lengths) {
      GemmShape g{T, c.hidden_size, models[i]->weights().layers[0].w_gate_up.size(0)};
      gemms.push_back(g);
      rows[g.Key()] = {shapes[i].name, T};
    }
  }
  std::vector<std::string> cores = RunnableOpenBlasCores(DetectCpuFeatures());
  if (std::find(cores.begin(), cores.end(), in_use) == cores.end())
    cores.insert(cores.begin(), in_use);
  std::printf("dominant prefill GEMM by OpenBLAS kernel (GF/s, best of 5, child processes):\n");
  std::printf("%-14s", "kernel");
  for (const GemmShape& g : gemms) std::printf(" %16s", g.Key().c_str());
  std::printf(" %10s\n", "% of peak");
  for (const std::string& core : cores) {
    const std::map<std::string, double> speeds = ProbeGemm(core, threads, gemms, 5);
    std::printf("%-14s", absl::StrCat(core, core == in_use ? "*" : "").c_str());
    double best_here = 0;
    for (const GemmShape& g : gemms) {
      auto it = speeds.find(g.Key());
      const double gf = it == speeds.end() ? 0 : it->second;
      std::printf(" %16.1f", gf);
      best_here = std::max(best_here, gf);
      Row& row = Results()[rows[g.Key()]];
      if (gf > row.best_gflops) {
        row.best_gflops = gf;
        row.best_core = core;
      }
    }
    std::printf(" %9.0f%%\n", peak.gflops() > 0 ? 100 * best_here / peak.gflops() : 0.0);
  }
  std::printf("(* = the kernel this process runs)\n\n");
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  std::string configs = ResolveSharedDir() + "/configs";
  int threads = 0, aten_threads = 0;
  bool quick = false, decode_report = false, batch_report = false;
  std::string gemm_probe;  // child mode (machine_limits.h)
  int gemm_reps = 3;
  std::string device_name = "cpu", dtype_names = "f32";
  BatchReportOptions batch_options;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--configs") && i + 1 < argc) {
      configs = argv[++i];
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--aten-threads") && i + 1 < argc) {
      aten_threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--decode-report")) {
      decode_report = true;
    } else if (!std::strcmp(argv[i], "--batch-report")) {
      batch_report = true;
    } else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      device_name = argv[++i];
    } else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) {
      dtype_names = argv[++i];
    } else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) {
      batch_options.tinyllama_layers = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--context") && i + 1 < argc) {
      batch_options.context = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--gemm-probe") && i + 1 < argc) {
      gemm_probe = argv[++i];
    } else if (!std::strcmp(argv[i], "--gemm-reps") && i + 1 < argc) {
      gemm_reps = std::atoi(argv[++i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  const ThreadSettings thread_settings = ConfigureThreads(threads, aten_threads);
  if (!gemm_probe.empty()) return RunGemmProbe(gemm_probe, gemm_reps);
  if (decode_report) {
    std::printf("threads: %s\n", thread_settings.ToString().c_str());
    return DecodeReport(configs);
  }
  if (batch_report) {
    std::printf("threads: %s\n", thread_settings.ToString().c_str());
    auto device = ParseDevice(device_name);
    if (!device.ok()) {
      std::fprintf(stderr, "scd_model_bench: %s\n", std::string(device.status().message()).c_str());
      return 1;
    }
    batch_options.device = *device;
    batch_options.dtypes.clear();
    for (absl::string_view name : absl::StrSplit(dtype_names, ',')) {
      auto dtype = ParsePrecision(std::string(name), *device);
      if (!dtype.ok()) {
        std::fprintf(stderr, "scd_model_bench: %s\n",
                     std::string(dtype.status().message()).c_str());
        return 1;
      }
      batch_options.dtypes.push_back(*dtype);
    }
    return BatchReport(configs, batch_options);
  }

  const std::vector<Shape> shapes = {{"tinyllama-1.1b-4L", "tinyllama-1.1b.json", 4},
                                     {"mistral-7b-v0.1-2L", "mistral-7b-v0.1.json", 2}};
  std::vector<int64_t> lengths = {128, 512, 2048};
  if (quick) lengths = {128, 512};
  std::vector<std::unique_ptr<LlamaModel>> models;
  for (const Shape& shape : shapes) {
    auto config = ModelConfig::FromFile(configs + "/" + shape.file);
    if (!config.ok()) {
      std::fprintf(stderr, "scd_model_bench: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    config->num_layers = shape.layers;
    models.push_back(LlamaModel::Dummy(*config, 1, {}));
    const LlamaModel* model = models.back().get();
    for (int64_t T : lengths) {
      benchmark::RegisterBenchmark(("prefill/" + shape.name).c_str(), BM_Prefill, model)
          ->Arg(T)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime()
          ->Iterations(T <= 128   ? 8
                       : T <= 512 ? 5
                                  : 3);
    }
    for (int64_t T : lengths) {
      benchmark::RegisterBenchmark(("decode/" + shape.name).c_str(), BM_Decode, model)
          ->Arg(T)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
    }
  }
  MeasureMachine(shapes, lengths, models, threads);
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  std::printf("\nSummary (%s; GFLOP/s counts GEMM and attention FLOPs):\n",
              thread_settings.ToString().c_str());
  std::printf("%-20s %6s %10s %12s %10s %14s %10s %8s %12s %12s\n", "model", "T", "mm GF/s",
              "prefill GF/s", "% of mm", "best mm GF/s", "% of best", "tok/s", "decode tok/s",
              "decode GF/s");
  std::printf(
      "(medians over iterations; %% of mm is the median of per-iteration ratios to the kernel in "
      "use; best mm: the same GEMM under the fastest kernel this CPU runs, in a child process)\n");
  for (const auto& [key, row] : Results()) {
    if (row.prefill_gflops == 0 && row.decode_tps == 0) continue;  // filtered out
    const std::string best =
        row.best_gflops > 0 ? absl::StrFormat("%.1f %s", row.best_gflops, row.best_core) : "-";
    std::printf("%-20s %6ld %10.1f %12.1f %9.1f%% %14s %9.1f%% %8.0f %12.2f %12.1f\n",
                key.first.c_str(), static_cast<long>(key.second), row.mm_gflops, row.prefill_gflops,
                row.pct_of_mm, best.c_str(),
                row.best_gflops > 0 ? 100 * row.prefill_gflops / row.best_gflops : 0.0,
                row.prefill_tps, row.decode_tps, row.decode_gflops);
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace scd

int main(int argc, char** argv) { return scd::Main(argc, argv); }
