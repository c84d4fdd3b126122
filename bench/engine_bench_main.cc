// scd-engine-bench: the runtime as an engine (bench/engine_bench.h), one model at one precision,
// the report as one JSON object on stdout (bench/peer.sh runs it beside llama.cpp).
//   scd-engine-bench (--model DIR | --dummy-weights CONFIG [--layers N] [--seed S])
//                    [--dtype f32|bf16|f16|int8] [--threads N] [--prompt-lengths 64,1024]
//                    [--batch-sizes 1,2,4,8,16] [--decode-steps 32] [--repeats 3]
//   scd-engine-bench ... --commands      one measurement per stdin line (EngineSession), for
//                                        bench/peer/bench_peer.py's interleaved comparison
// Errors: one line on stderr, exit status 1.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/engine_bench.h"
#include "model/blas_kernel.h"
#include "model/cpu_simd.h"
#include "model/llama_model.h"
#include "model/runtime.h"

namespace scd::bench {
namespace {

struct Flags {
  std::string model, dummy;
  int64_t layers = 0;
  uint64_t seed = 1;
  std::string dtype = "f32";
  int threads = 0;
  int probe = 0;
  bool commands = false;
  EngineBenchOptions options;
};

// The interleaved comparison's side of this runtime (EngineSession): "ready", then one answer per
// command line on stdin until EOF.
absl::Status Commands(const LlamaModel& model, int64_t decode_prompt) {
  EngineSession session(model, decode_prompt, decode_prompt + 256);
  std::printf("ready\n");
  std::fflush(stdout);
  char line[128];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    std::string command(line);
    while (!command.empty() && (command.back() == '\n' || command.back() == '\r')) command.pop_back();
    SCD_ASSIGN_OR_RETURN(std::string answer, session.Handle(command));
    std::printf("%s\n", answer.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Run(const Flags& flags) {
  const ThreadSettings threads = ConfigureThreads(flags.threads);
  SCD_ASSIGN_OR_RETURN(const Precision precision, ParsePrecision(flags.dtype, c10::Device("cpu")));
  LlamaModel::Options options;
  options.dtype = precision.dtype;
  options.weights = precision.weights;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<LlamaModel> model;
  if (!flags.model.empty()) {
    SCD_ASSIGN_OR_RETURN(model, LlamaModel::Load(flags.model, options));
  } else {
    SCD_ASSIGN_OR_RETURN(model,
                         LlamaModel::DummyFromConfig(flags.dummy, flags.seed, flags.layers, options));
  }
  const double load =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (flags.commands) return Commands(*model, flags.options.decode_prompt);
  if (flags.probe > 0) {
    for (int i = 0; i < 5; ++i) std::printf("projection %.1f GB/s\n", ProjectionBandwidth(*model, flags.probe));
    return absl::OkStatus();
  }
  SCD_ASSIGN_OR_RETURN(EngineReport report, RunEngineBench(*model, flags.options));
  report.load_seconds = load;
  const std::string source = flags.model.empty() ? flags.dummy : flags.model;
  std::printf("%s\n",
              report
                  .ToJson(absl::StrFormat(
                      "\"model\": \"%s\", \"layers\": %d, \"precision\": \"%s\", \"threads\": %d, "
                      "\"kernels\": \"%s\", \"blas\": \"%s\"",
                      std::filesystem::path(source).filename().string(), model->config().num_layers,
                      PrecisionName(model->precision()), threads.blas_threads,
                      KernelIsaName(RunnableKernelIsa()), threads.kernel))
                  .c_str());
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  CLI::App app{"the runtime as an engine: TTFT, prefill and batched decode speed, memory"};
  Flags flags;
  auto* model = app.add_option("--model", flags.model, "Hugging Face model directory");
  auto* dummy = app.add_option("--dummy-weights", flags.dummy, "config.json: seeded dummy weights");
  model->excludes(dummy);
  app.add_option("--layers", flags.layers, "dummy weights: the first N layers");
  app.add_option("--seed", flags.seed, "dummy weights' seed")->capture_default_str();
  app.add_option("--dtype", flags.dtype, "f32, bf16, f16 or int8")->capture_default_str();
  app.add_option("--threads", flags.threads, "compute threads (0: all cores)");
  app.add_option("--prompt-lengths", flags.options.prompt_lengths, "TTFT prompts")
      ->delimiter(',');
  app.add_option("--batch-sizes", flags.options.batch_sizes, "sequences decoding together")
      ->delimiter(',');
  app.add_option("--decode-steps", flags.options.decode_steps, "timed steps")
      ->capture_default_str();
  app.add_option("--repeats", flags.options.repeats, "TTFT measurements per short prompt")
      ->capture_default_str();
  app.add_option("--probe-projection", flags.probe, "only: GB/s of one projection, N reps");
  app.add_flag("--commands", flags.commands,
               "answer measurement commands on stdin (bench/engine_bench.h, EngineSession)");
  CLI11_PARSE(app, argc, argv);
  if (flags.model.empty() == flags.dummy.empty()) {
    std::fprintf(stderr, "scd-engine-bench: give --model DIR or --dummy-weights CONFIG\n");
    return 1;
  }
  const absl::Status status = Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "scd-engine-bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace scd::bench

int main(int argc, char** argv) { return scd::bench::Main(argc, argv); }
