// What the fuzz targets share: bytes as a file a loader can open by path (a memfd, no disk).
// Thread-safety: one fuzzer thread.
#ifndef SCD_TESTS_FUZZ_FUZZ_UTIL_H_
#define SCD_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace scd::fuzz {

// `data` in an anonymous in-memory file; path() is "/proc/self/fd/N" until destruction.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("scd-fuzz", MFD_CLOEXEC);
    size_t done = 0;
    while (fd_ >= 0 && done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() {
    if (fd_ >= 0) close(fd_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace scd::fuzz

#endif  // SCD_TESTS_FUZZ_FUZZ_UTIL_H_
