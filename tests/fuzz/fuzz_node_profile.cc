// libFuzzer target: a cluster simulator node profile (bench/node_profile.h). Whatever parses
// must write back to a file that parses to the same text (its numbers exact, its strings
// escaped).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/node_profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<scd::bench::NodeProfile> profile = scd::bench::ParseNodeProfile(text);
  if (!profile.ok()) return 0;
  const std::string written = scd::bench::NodeProfileToml(*profile);
  absl::StatusOr<scd::bench::NodeProfile> again = scd::bench::ParseNodeProfile(written);
  if (!again.ok() || scd::bench::NodeProfileToml(*again) != written) std::abort();
  return 0;
}
