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
  // Removes what the process `pid` made (its namespaces and the caller-side link, a
  // NetnsNode's too), for a termination-signal handler thread that exits right after.
  static void RemoveAllOf(int pid);

 private:
  NetnsLink() = default;
  void Remove();

  std::string producer_ns_, consumer_ns_, producer_dev_;
  std::string producer_ip_, consumer_ip_, caller_peer_ip_, caller_dev_;
  bool owned_ = false;
};

// NetnsNode: one node's own network namespace, joined to the caller's by a veth pair whose link
// can be taken down and up -- a cable pulled and put back (`scd-bench soak --link netns`: the
// producer runs in it). The rest of the deployment listens on host_ip(), which the node reaches
// over the pair; the node listens on node_ip(). Down: the node's end of the pair goes down, so
// packets either way are lost (open connections stall until their keepalive or timeout) and the
// node's new connections fail at once; up: the link and its route come back. Made, cleaned up
// and removed as NetnsLink's (the same name prefix). Needs root and iproute2.
// Thread-safety: not thread-safe; one owner.
class NetnsNode {
 public:
  static absl::StatusOr<NetnsNode> Create();
  NetnsNode(NetnsNode&& other) noexcept;
  NetnsNode& operator=(NetnsNode&& other) = delete;
  NetnsNode(const NetnsNode&) = delete;
  ~NetnsNode();

  absl::Status SetLinkUp(bool up);
  std::vector<std::string> Inside(std::vector<std::string> argv) const;
  const std::string& host_ip() const { return host_ip_; }
  const std::string& node_ip() const { return node_ip_; }

 private:
  NetnsNode() = default;
  void Remove();

  std::string ns_, node_dev_, host_dev_, host_ip_, node_ip_;
  bool owned_ = false;
};

}  // namespace scd::bench

#endif  // SCD_BENCH_NETNS_LINK_H_
