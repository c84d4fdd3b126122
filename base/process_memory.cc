#include "base/process_memory.h"

#include <malloc.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/thread_name.h"

namespace scd {

int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits.push_back(c);
    }
    int64_t kb = 0;
    if (absl::SimpleAtoi(digits, &kb)) return kb * 1024;
  }
  return -1;
}

int64_t ReleaseFreeMemory() {
  const int64_t before = ResidentBytes();
  malloc_trim(0);
  return before - ResidentBytes();
}

MemoryTrimmer::MemoryTrimmer(absl::Duration interval)
    : interval_(interval), thread_([this] { Loop(); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MemoryTrimmer::Loop() {
  NameThisThread("scd-trim");
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
    if (stop_) return;
    mu_.Unlock();
    const int64_t released = ReleaseFreeMemory();
    mu_.Lock();
    if (released > 0) released_ += released;
    ++trims_;
  }
}

}  // namespace scd
