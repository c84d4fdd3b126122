// The deployment `scd-bench sweep` starts for itself and stops when done: either
//  - `scd serve --all-in-one` on loopback (codes over the in-process transport, shaped by the
//    producer's shaper), or
//  - for `--link netns`, scd-coordinator and scd-consumer in the consumer's network namespace and
//    scd-producer in the producer's (bench/netns_link.h), codes over gRPC on the shaped veth;
//  - with CPU lists (--producer-cpus/--consumer-cpus) the same three daemons, on loopback unless
//    netns, each pinned with taskset to its list and given as many compute threads as it has
//    CPUs: on a small machine this is what two machines are, the producer's prefill never shares
//    a core with the consumer's rebuild (one all-in-one process or two unpinned daemons do).
// Both get a fresh cluster secret; addresses come back through --address-file. Models: a
// directory (real weights, fidelity) or a config.json (dummy weights, --layers, the daemons'
// default seeds, which scd-calib synth's match).
// Thread-safety: not thread-safe; one owner. Destruction stops every process (SIGTERM, then
// SIGKILL) and removes the namespaces.
#ifndef SCD_BENCH_SWEEP_DEPLOYMENT_H_
#define SCD_BENCH_SWEEP_DEPLOYMENT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/child_process.h"
#include "bench/netns_link.h"

namespace scd::bench {

struct DeploymentSpec {
  std::string bin_dir;                 // where scd, scd-coordinator, ... are
  std::string producer;                // model directory or config.json
  std::vector<std::string> consumers;  // NAME=DIR|CONFIG[:ARTIFACT]
  int64_t layers = 0;                  // dummy weights: keep the first N layers
  std::string dir;                     // logs, address files, the secret
  bool netns = false;
  // CPU lists ("0", "2-3", "0,2"), both or neither: the producer on the first, the coordinator
  // and the consumers on the second.
  std::string producer_cpus, consumer_cpus;
};

// The number of CPUs in a list like "0-3,6"; INVALID_ARGUMENT when malformed or naming a CPU this
// process may not run on (sched_getaffinity).
absl::StatusOr<int> CountCpus(const std::string& list);

class SweepDeployment {
 public:
  // INVALID_ARGUMENT for a malformed --consumer or CPU list; the failing process's log tail
  // otherwise.
  static absl::StatusOr<std::unique_ptr<SweepDeployment>> Start(const DeploymentSpec& spec);
  ~SweepDeployment();

  const std::string& server() const { return server_; }    // public API, reachable from here
  const std::string& control() const { return control_; }  // coordinator's control plane
  const std::string& secret() const { return secret_; }
  const std::vector<std::string>& consumer_names() const { return names_; }
  bool fidelity() const { return fidelity_; }  // every model has real weights
  NetnsLink* netns() { return netns_ ? &*netns_ : nullptr; }

 private:
  SweepDeployment() = default;
  absl::Status StartAllInOne(const DeploymentSpec& spec);
  absl::Status StartDaemons(const DeploymentSpec& spec);

  std::string server_, control_, secret_, secret_file_;
  std::vector<std::string> names_;
  bool fidelity_ = true;
  std::optional<NetnsLink> netns_;
  std::vector<ChildProcess> processes_;  // stopped in reverse order
};

}  // namespace scd::bench

#endif  // SCD_BENCH_SWEEP_DEPLOYMENT_H_
