#include "base/process_memory.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/thread_name.h"

namespace scd {

ResidentMemory ResidentOf(pid_t pid) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : absl::StrCat("/proc/", pid, "/status"));
  ResidentMemory memory;
  const std::pair<const char*, int64_t*> fields[] = {{"VmRSS:", &memory.total},
                                                     {"RssAnon:", &memory.anon},
                                                     {"RssFile:", &memory.file},
                                                     {"RssShmem:", &memory.shmem}};
  std::string line;
  while (std::getline(status, line)) {
    for (const auto& [name, field] : fields) {
      if (line.rfind(name, 0) != 0) continue;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits.push_back(c);
      }
      int64_t kb = 0;
      if (absl::SimpleAtoi(digits, &kb)) *field = kb * 1024;
    }
  }
  if (memory.total < 0) memory = ResidentMemory{};
  return memory;
}

int64_t ResidentBytes(pid_t pid) { return ResidentOf(pid).total; }

int64_t ReleaseFreeMemory() {
  const int64_t before = ResidentBytes();
  malloc_trim(0);
  return before - ResidentBytes();
}

bool LimitMallocArenas(int arenas) { return arenas > 0 && mallopt(M_ARENA_MAX, arenas) == 1; }

int64_t MallocInUseBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

int MallocArenas() {
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  if (out == nullptr) return 0;
  const int status = malloc_info(0, out);
  std::fclose(out);
  int arenas = 0;
  if (status == 0 && text != nullptr) {
    for (const char* p = text; (p = std::strstr(p, "<heap nr=")) != nullptr; ++p) ++arenas;
  }
  std::free(text);
  return arenas;
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
