#include "base/tally.h"

#include <algorithm>

namespace scd {
namespace {

std::string Key(std::string name) {
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

}  // namespace

void Tally::Add(const std::string& name, uint64_t n) {
  absl::MutexLock lock(&mu_);
  counts_[Key(name)] += n;
}

uint64_t Tally::Get(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = counts_.find(Key(name));
  return it == counts_.end() ? 0 : it->second;
}

std::map<std::string, uint64_t> Tally::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace scd
