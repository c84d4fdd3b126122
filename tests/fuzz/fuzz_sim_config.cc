// libFuzzer target: the cluster simulator's deployment and workload files (bench/sim_config.h).
// The first byte picks the file ('d': a deployment, whose profiles and traces come from memory by
// name -- a path with "producer" a producer's, with "consumer" a consumer's, with "trace" a
// trace, else not found; 't': a bandwidth trace, bench/link_trace.h; otherwise a workload); the
// rest is its text. Whatever parses is checked the way the simulator uses it: a
// workload against a small deployment, a deployment's links for every pool pair.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench/sim_config.h"

namespace {

using scd::bench::NodeProfile;
using scd::bench::NodeRole;

absl::StatusOr<NodeProfile> Profile(const std::string& path) {
  NodeProfile p;
  p.model = "m";
  p.prefill = {10, 1, 0};
  if (path.find("producer") != std::string::npos) {
    p.role = NodeRole::kProducer;
    p.link_goodput_gbps = 1;
    return p;
  }
  if (path.find("consumer") == std::string::npos) return absl::NotFoundError(path);
  p.decode_step = {100, 10, 0};
  p.kv_bytes_per_token = 100;
  p.kv_budget_bytes = 1 << 20;
  p.capacity = 8;
  p.step_rows = 256;
  return p;
}

// A link's trace by name: "trace" one of two steps, else not found.
absl::StatusOr<std::vector<scd::bench::TraceStep>> Trace(const std::string& path) {
  if (path.find("trace") == std::string::npos) return absl::NotFoundError(path);
  return std::vector<scd::bench::TraceStep>{{0, 1}, {1, 0.5}};
}

constexpr char kDeployment[] =
    "[[producer_pool]]\nname = \"p\"\nprofile = \"producer\"\n[[consumer_pool]]\nname = \"a\"\n"
    "profile = \"consumer\"\nproducer = \"p\"\ncode_bytes_per_token = 10\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] == 'd') {
    absl::StatusOr<scd::bench::SimDeployment> d =
        scd::bench::ParseSimDeployment(text, "", Profile, Trace);
    if (!d.ok()) return 0;
    if (d->consumers.empty() || d->nodes() > scd::bench::kMaxSimNodes) std::abort();
    for (size_t p = 0; p < d->producers.size(); ++p) {
      for (size_t c = 0; c < d->consumers.size(); ++c) {
        const scd::bench::SimLink link = d->LinkOf(p, c);
        if (!(link.gbps > 0) && link.steps == nullptr) std::abort();
      }
    }
    return 0;
  }
  if (data[0] == 't') {  // a bandwidth trace: what parses has a rate at every time and an end
    absl::StatusOr<std::vector<scd::bench::TraceStep>> trace =
        scd::bench::ParseBandwidthTrace(std::string(text));
    if (!trace.ok()) return 0;
    if (trace->empty() || !(scd::bench::RateAt(*trace, 1e300) > 0)) std::abort();
    if (std::isnan(scd::bench::TraceSendSeconds(*trace, 0, 1e6))) std::abort();
    return 0;
  }
  absl::StatusOr<scd::bench::SimWorkload> w = scd::bench::ParseSimWorkload(text);
  if (!w.ok()) return 0;
  if (w->mix.empty()) std::abort();
  absl::StatusOr<scd::bench::SimDeployment> d =
      scd::bench::ParseSimDeployment(kDeployment, "", Profile);
  if (!d.ok()) std::abort();
  scd::bench::CheckSimWorkload(*w, *d).IgnoreError();
  return 0;
}
