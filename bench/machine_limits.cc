#include "bench/machine_limits.h"

#include <ATen/ATen.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/blas_kernel.h"

namespace scd {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Cycles per second from a chain of dependent integer adds: each waits for the one before (one
// cycle of latency on every x86 core since the Pentium 4), and the loop's own counter runs beside
// the chain on the other ALUs. Best of five, so a descheduled round does not count.
double MeasureGhz() {
  constexpr int64_t kBlocks = 25'000'000;  // x 8 adds
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    uint64_t x = 0;
    const double start = Now();
    for (int64_t i = 0; i < kBlocks; ++i) {
      __asm__ volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
          : "+r"(x));
    }
    best = std::min(best, Now() - start);
  }
  return 8.0 * kBlocks / best / 1e9;
}

// Physical cores among the CPUs this process may use: logical CPUs / SMT siblings per core.
int PhysicalCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int logical = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  std::ifstream in("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list");
  std::string siblings;
  int smt = 1;
  if (in >> siblings) {
    smt = 0;
    for (absl::string_view part : absl::StrSplit(siblings, ',')) {
      std::vector<std::string> range = absl::StrSplit(part, '-');
      int a = 0, b = 0;
      if (range.size() == 2 && absl::SimpleAtoi(range[0], &a) && absl::SimpleAtoi(range[1], &b)) {
        smt += b - a + 1;
      } else {
        ++smt;
      }
    }
  }
  return std::max(1, logical / std::max(1, smt));
}

}  // namespace

std::string PeakEstimate::Describe() const {
  return absl::StrFormat(
      "%d cores x %d lanes (%s) x %d flops (%s) x %d units x %.2f GHz = %.1f GF/s", cores, lanes,
      isa, flops_per_lane, isa == "AVX2+FMA" || isa == "AVX-512" ? "FMA" : "mul+add", units, ghz,
      gflops());
}

PeakEstimate EstimateFp32Peak() {
  const CpuFeatures cpu = DetectCpuFeatures();
  PeakEstimate p;
  p.isa = IsaLevelName(cpu.level());
  p.cores = PhysicalCores();
  p.lanes = cpu.level() == IsaLevel::kAvx512 ? 16 : cpu.level() >= IsaLevel::kAvx ? 8 : 4;
  // FMA: one fused multiply-add per lane per unit and cycle; without it one multiply on one port
  // and one add on another, the same two flops.
  p.flops_per_lane = 2;
  p.units = cpu.level() >= IsaLevel::kAvx2 ? 2 : 1;
  p.ghz = MeasureGhz();
  return p;
}

std::string GemmShape::Key() const { return absl::StrCat(m, "x", k, "x", n); }

std::map<std::string, double> ProbeGemm(const std::string& core, int threads,
                                        const std::vector<GemmShape>& shapes, int reps) {
  std::vector<std::string> keys;
  for (const GemmShape& s : shapes) keys.push_back(s.Key());
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return {};
  const std::string command = absl::StrCat(
      "env OPENBLAS_CORETYPE=", core, " '", std::string(self, static_cast<size_t>(n)),
      "' --threads ", threads, " --gemm-probe ", absl::StrJoin(keys, ","), " --gemm-reps ", reps);
  std::map<std::string, double> out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    std::fprintf(stderr, "scd_model_bench: cannot run %s\n", command.c_str());
    return out;
  }
  char line[512];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::vector<std::string> parts = absl::StrSplit(absl::StripTrailingAsciiWhitespace(line), ' ');
    double gflops = 0;
    if (parts.size() == 3 && parts[0] == "gemm" && absl::SimpleAtod(parts[2], &gflops)) {
      out[parts[1]] = gflops;
    }
  }
  const int status = pclose(pipe);
  if (status != 0 || out.size() != shapes.size()) {
    std::fprintf(stderr, "scd_model_bench: GEMM probe with core %s failed (status %d)\n",
                 core.c_str(), status);
    out.clear();
  }
  return out;
}

int RunGemmProbe(const std::string& spec, int reps) {
  for (absl::string_view key : absl::StrSplit(spec, ',')) {
    std::vector<std::string> dims = absl::StrSplit(key, 'x');
    GemmShape s;
    if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &s.m) || !absl::SimpleAtoi(dims[1], &s.k) ||
        !absl::SimpleAtoi(dims[2], &s.n)) {
      std::fprintf(stderr, "--gemm-probe: '%s' is not MxKxN\n", std::string(key).c_str());
      return 2;
    }
    at::Tensor x = at::randn({s.m, s.k}), w = at::randn({s.n, s.k});
    at::Tensor y = at::mm(x, w.t());  // warm-up: packing buffers, page faults
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const double start = Now();
      y = at::mm(x, w.t());
      best = std::min(best, Now() - start);
    }
    std::printf("gemm %s %.2f\n", s.Key().c_str(), s.flops() / best / 1e9);
  }
  return 0;
}

}  // namespace scd
