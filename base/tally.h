// Tally: named event counters ("completed", "peer_lost", ...) that services bump as things end and
// report in their Stats RPC. Names are created on first use; a snapshot is sorted by name.
// Thread-safety: thread-safe.
#ifndef SCD_BASE_TALLY_H_
#define SCD_BASE_TALLY_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {

class Tally {
 public:
  // Adds `n` to `name`'s count. Spaces in `name` become underscores (metric-friendly keys).
  void Add(const std::string& name, uint64_t n = 1);
  uint64_t Get(const std::string& name) const;
  std::map<std::string, uint64_t> Snapshot() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_TALLY_H_
