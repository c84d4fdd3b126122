// NetnsLink: a real network link for `scd-bench sweep --link netns`: two network namespaces,
// the producer's and the consumer's, joined by a veth pair whose producer-side egress is shaped
// with tc (tbf rate; netem delay for latency where the kernel has sch_netem), and a second,
// unshaped veth pair from the caller's namespace into the consumer's so the harness reaches the
// coordinator that runs there. Created and removed by the harness: the destructor deletes both
// namespaces (which deletes their links), a failed Create leaves nothing behind, and Create first
// removes namespaces left by an earlier run whose process is gone (killed with SIGKILL).
// Needs root (CAP_NET_ADMIN) and iproute2.
// Thread-safety: not thread-safe; one owner.
#ifndef SCD_BENCH_NETNS_LINK_H_
#define SCD_BENCH_NETNS_LINK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd::bench {

class NetnsLink {
 public:
  // PERMISSION_DENIED (not root) or FAILED_PRECONDITION (no `ip`, no namespace support) with
  // what to do; nothing is left behind on any error.
  static absl::StatusOr<NetnsLink> Create();
  NetnsLink(NetnsLink&& other) noexcept;
  NetnsLink& operator=(NetnsLink&& other) = delete;
  NetnsLink(const NetnsLink&) = delete;
  ~NetnsLink();

  // Shapes the producer -> consumer direction: `gbps` (0 or inf: unshaped) and one-way
  // `latency_us` (FAILED_PRECONDITION when > 0 and the kernel has no sch_netem).
  absl::Status Shape(double gbps, double latency_us);

  // argv prefixed to run inside the producer's / consumer's namespace.
  std::vector<std::string> InProducer(std::vector<std::string> argv) const;
  std::vector<std::string> InConsumer(std::vector<std::string> argv) const;
  // Addresses: the producer's and consumer's ends of the shaped pair, and the consumer's end of
  // the caller's pair (what the harness dials).
  const std::string& producer_ip() const { return producer_ip_; }
  const std::string& consumer_ip() const { return consumer_ip_; }
  const std::string& consumer_ip_from_caller() const { return caller_peer_ip_; }

  // Every namespace this tool ever made that is still there (for tests: none after a run).
  static std::vector<std::string> Leftovers();
  // Removes what the process `pid` made (its namespaces and the caller-side link), for a
  // termination-signal handler thread that exits right after.
  static void RemoveAllOf(int pid);

 private:
  NetnsLink() = default;
  void Remove();

  std::string producer_ns_, consumer_ns_, producer_dev_;
  std::string producer_ip_, consumer_ip_, caller_peer_ip_, caller_dev_;
  bool owned_ = false;
};

}  // namespace scd::bench

#endif  // SCD_BENCH_NETNS_LINK_H_
