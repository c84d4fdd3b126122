// CPU features come from CPUID and XGETBV (what the OS saves decides what may run, not only what
// the silicon has); OpenBLAS is reached through dlsym, so a libtorch on another BLAS is untouched.
// The re-execution hands its state to the new process image in one environment variable
// (kStageVar): the core OpenBLAS had picked, and whether the fallback was simulated.
#include "model/blas_kernel.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace scd {
namespace {

constexpr char kCoreTypeVar[] = "OPENBLAS_CORETYPE";
// Set by this module for the process image it executes next: "<picked>" or "<picked>,simulated",
// or "simulate" for the first step of the test-only simulation.
constexpr char kStageVar[] = "SCD_BLAS_REEXEC";
constexpr char kSimulateVar[] = "SCD_BLAS_SIMULATE_FALLBACK";
constexpr char kSimulateStage[] = "simulate";
constexpr char kGenericCore[] = "Prescott";

struct CoreLevel {
  const char* name;
  IsaLevel level;
};
// OpenBLAS's DYNAMIC_ARCH core names (driver/others/dynamic.c) and the ISA their kernels need.
constexpr CoreLevel kCores[] = {
    {"Katmai", IsaLevel::kSse3},       {"Coppermine", IsaLevel::kSse3},
    {"Northwood", IsaLevel::kSse3},    {"Prescott", IsaLevel::kSse3},
    {"Banias", IsaLevel::kSse3},       {"Atom", IsaLevel::kSse3},
    {"Core2", IsaLevel::kSse3},        {"Penryn", IsaLevel::kSse3},
    {"Dunnington", IsaLevel::kSse3},   {"Nehalem", IsaLevel::kSse3},
    {"Athlon", IsaLevel::kSse3},       {"Opteron", IsaLevel::kSse3},
    {"Opteron_SSE3", IsaLevel::kSse3}, {"Barcelona", IsaLevel::kSse3},
    {"Nano", IsaLevel::kSse3},         {"Bobcat", IsaLevel::kSse3},
    {"Sandybridge", IsaLevel::kAvx},   {"Bulldozer", IsaLevel::kAvx},
    {"Piledriver", IsaLevel::kAvx},    {"Steamroller", IsaLevel::kAvx},
    {"Excavator", IsaLevel::kAvx},     {"Haswell", IsaLevel::kAvx2},
    {"Zen", IsaLevel::kAvx2},          {"SkylakeX", IsaLevel::kAvx512},
    {"Cooperlake", IsaLevel::kAvx512}, {"SapphireRapids", IsaLevel::kAvx512},
};

// The core OpenBLAS offers for each ISA level (the ones `make test` and the bench try).
const char* CoreFor(IsaLevel level) {
  switch (level) {
    case IsaLevel::kAvx512:
      return "SkylakeX";
    case IsaLevel::kAvx2:
      return "Haswell";
    case IsaLevel::kAvx:
      return "Sandybridge";
    case IsaLevel::kSse3:
      return kGenericCore;
  }
  return kGenericCore;
}

uint64_t Xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

absl::Mutex report_mu(absl::kConstInit);
std::string* report ABSL_GUARDED_BY(report_mu) = nullptr;

void SetReport(std::string text) {
  absl::MutexLock lock(&report_mu);
  if (report == nullptr) report = new std::string();
  *report = std::move(text);
}

// Logging is not set up yet when main() starts: one line straight to stderr, in the tools' format.
void Log(spdlog::level::level_enum level, const std::string& line) {
  spdlog::logger logger("blas", std::make_shared<spdlog::sinks::stderr_color_sink_st>());
  logger.set_pattern("[%H:%M:%S.%e] [%l] %v");
  logger.log(level, line);
}

std::string CpuSummary(const CpuFeatures& cpu) {
  std::string brand = cpu.brand.empty() ? cpu.vendor : cpu.brand;
  return absl::StrCat(IsaLevelName(cpu.level()), "; ", brand, ", family ", cpu.family, " model ",
                      cpu.model);
}

// Replaces the process with a new image of the same program; returns only on failure.
void ReExecute(char** argv, const std::string& core, const std::string& stage) {
  setenv(kCoreTypeVar, core.c_str(), 1);
  setenv(kStageVar, stage.c_str(), 1);
  execv("/proc/self/exe", argv);
  const int error = errno;
  unsetenv(kCoreTypeVar);
  unsetenv(kStageVar);
  Log(spdlog::level::warn,
      absl::StrCat("blas: cannot re-execute with ", kCoreTypeVar, "=", core, " (",
                   std::strerror(error), "); keeping core ", OpenBlasCoreInUse()));
}

}  // namespace

const char* IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kSse3:
      return "SSE3";
    case IsaLevel::kAvx:
      return "AVX";
    case IsaLevel::kAvx2:
      return "AVX2+FMA";
    case IsaLevel::kAvx512:
      return "AVX-512";
  }
  return "?";
}

IsaLevel CpuFeatures::level() const {
  if (avx512 && avx2_fma) return IsaLevel::kAvx512;
  if (avx2_fma) return IsaLevel::kAvx2;
  if (avx) return IsaLevel::kAvx;
  return IsaLevel::kSse3;
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures cpu;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return cpu;
  const unsigned max_leaf = eax;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  cpu.vendor = vendor;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const int base_family = (eax >> 8) & 0xf;
  cpu.family = base_family + (base_family == 0xf ? ((eax >> 20) & 0xff) : 0);
  cpu.model = ((eax >> 4) & 0xf) |
              ((base_family == 0x6 || base_family == 0xf) ? (((eax >> 16) & 0xf) << 4) : 0);
  const bool osxsave = ecx & (1u << 27);
  const bool fma = ecx & (1u << 12);
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  cpu.avx = (ecx & (1u << 28)) && (xcr0 & 0x6) == 0x6;  // XMM and YMM state saved
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
    cpu.avx2_fma = cpu.avx && fma && (ebx & (1u << 5));
    const unsigned avx512_bits = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
    cpu.avx512 = cpu.avx2_fma && (ebx & avx512_bits) == avx512_bits && (xcr0 & 0xe0) == 0xe0;
  }
  if (__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) && eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &eax, &ebx, &ecx, &edx);
      std::memcpy(brand + 16 * leaf, &eax, 4);
      std::memcpy(brand + 16 * leaf + 4, &ebx, 4);
      std::memcpy(brand + 16 * leaf + 8, &ecx, 4);
      std::memcpy(brand + 16 * leaf + 12, &edx, 4);
    }
    cpu.brand = std::string(absl::StripAsciiWhitespace(brand));
  }
  return cpu;
}

std::optional<IsaLevel> OpenBlasCoreLevel(absl::string_view core) {
  for (const CoreLevel& entry : kCores) {
    if (absl::EqualsIgnoreCase(entry.name, core)) return entry.level;
  }
  return std::nullopt;
}

std::vector<std::string> RunnableOpenBlasCores(const CpuFeatures& cpu) {
  std::vector<std::string> cores;
  for (int level = static_cast<int>(cpu.level()); level >= 0; --level) {
    cores.push_back(CoreFor(static_cast<IsaLevel>(level)));
  }
  return cores;
}

BlasKernelDecision DecideBlasKernel(const BlasKernelInputs& inputs) {
  BlasKernelDecision d;
  if (inputs.picked.empty()) {
    d.reason = "the BLAS is not OpenBLAS";
    return d;
  }
  if (inputs.user_chose) {
    d.reason = absl::StrCat(kCoreTypeVar, " set by the user");
    return d;
  }
  const std::optional<IsaLevel> picked = OpenBlasCoreLevel(inputs.picked);
  const IsaLevel best = inputs.cpu.level();
  if (!picked.has_value()) {
    d.reason = absl::StrCat("picked by OpenBLAS (a core this check does not know)");
    return d;
  }
  if (*picked <= IsaLevel::kAvx && best >= IsaLevel::kAvx2 && *picked < best) {
    d.switch_core = true;
    d.core = CoreFor(best);
    d.reason = absl::StrCat("OpenBLAS picked ", inputs.picked, ", a generic ",
                            IsaLevelName(*picked), " kernel, on a CPU with ", IsaLevelName(best));
    return d;
  }
  d.reason = "picked by OpenBLAS";
  return d;
}

std::string OpenBlasCoreInUse() {
  using CoreName = char* (*)();
  auto corename = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "";
  const char* name = corename();
  return name == nullptr ? "" : std::string(name);
}

void SelectBlasKernel(int /*argc*/, char** argv) {
  const CpuFeatures cpu = DetectCpuFeatures();
  const std::string in_use = OpenBlasCoreInUse();
  const char* stage_env = std::getenv(kStageVar);
  const std::string stage = stage_env == nullptr ? "" : stage_env;
  unsetenv(kStageVar);  // programs this one starts decide for themselves
  const char* core_env = std::getenv(kCoreTypeVar);
  const bool core_set = core_env != nullptr && *core_env != '\0';

  if (!stage.empty() && stage != kSimulateStage) {
    // This image was executed by ReExecute: say what happened, once.
    const std::vector<std::string> parts = absl::StrSplit(stage, ',');
    const bool simulated = parts.size() > 1 && parts[1] == "simulated";
    const std::string asked = core_set ? core_env : "";
    std::string line = absl::StrCat(
        "blas: OpenBLAS picked ", parts[0], ", a generic kernel, on this CPU (", CpuSummary(cpu),
        ")", simulated ? " [simulated fallback: SCD_BLAS_SIMULATE_FALLBACK]" : "",
        "; re-executed with ", kCoreTypeVar, "=", asked, ": core now ", in_use);
    if (!absl::EqualsIgnoreCase(asked, in_use)) {
      line += absl::StrCat(" (OpenBLAS did not take ", asked, ")");
    }
    Log(spdlog::level::warn, line);
    SetReport(absl::StrCat("openblas core ", in_use, " (OpenBLAS picked ", parts[0],
                           simulated ? " [simulated]" : "", "; re-executed with ", kCoreTypeVar,
                           "=", asked, "; CPU: ", IsaLevelName(cpu.level()), ")"));
    return;
  }
  const bool simulate = stage.empty() && !in_use.empty() && std::getenv(kSimulateVar) != nullptr &&
                        std::string(std::getenv(kSimulateVar)) == "1";
  if (simulate) {
    // Step one of the simulation: run on the generic kernels, as a CPU OpenBLAS does not know.
    unsetenv(kSimulateVar);
    ReExecute(argv, kGenericCore, kSimulateStage);
  }
  BlasKernelInputs inputs{in_use, cpu, core_set && stage != kSimulateStage};
  const BlasKernelDecision decision = DecideBlasKernel(inputs);
  if (decision.switch_core) {
    ReExecute(argv, decision.core,
              stage == kSimulateStage ? absl::StrCat(in_use, ",simulated") : in_use);
  }
  SetReport(in_use.empty() ? "no OpenBLAS (another BLAS library; left alone)"
                           : absl::StrCat("openblas core ", in_use, " (", decision.reason,
                                          "; CPU: ", IsaLevelName(cpu.level()), ")"));
}

std::string BlasKernelReport() {
  {
    absl::MutexLock lock(&report_mu);
    if (report != nullptr) return *report;
  }
  const std::string in_use = OpenBlasCoreInUse();
  if (in_use.empty()) return "no OpenBLAS (another BLAS library; left alone)";
  return absl::StrCat("openblas core ", in_use, " (SelectBlasKernel not called; CPU: ",
                      IsaLevelName(DetectCpuFeatures().level()), ")");
}

}  // namespace scd
