// The deployment `scd-bench soak` runs its load and faults against (bench/soak.h): real daemons
// as child processes on loopback -- an etcd (Debian's etcd-server) every node registers in under
// a lease, coordinators watching it, one producer, consumers (several may serve one model
// name: replicas) with their artifacts, prefix caches on, codes over gRPC (or UCX) -- and what a
// fault schedule does to them: kill -9 and restart a node, SIGSTOP / SIGCONT it, replace a
// coordinator (a new one first, then SIGTERM drains the old), restart etcd, take the producer's
// link down and up (when it runs in a namespace of its own). Every incarnation of a
// node writes its own log and address files (DIR/NAME.GEN.log); a restarted daemon listens on a
// fresh port and registers anew (etcd keeps its ports and data). What the harness reads: each
// node's addresses, its Stats over the control plane, and its process's descriptors, threads and
// resident memory from /proc.
// Thread-safety: Snapshot, Stats, Sample and ServedBy may be called from any thread; the rest
// (Start, Kill, Restart, Freeze, Thaw, Replace, destruction) only from the thread that started
// the deployment -- children get SIGTERM when the thread that started them ends
// (base/child_process.h).
#ifndef SCD_BENCH_SOAK_DEPLOYMENT_H_
#define SCD_BENCH_SOAK_DEPLOYMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/child_process.h"
#include "base/cpu_quota.h"
#include "bench/netns_link.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/inference.pb.h"

namespace scd::bench {

enum class SoakRole { kEtcd, kCoordinator, kProducer, kConsumer };
const char* SoakRoleName(SoakRole role);

struct SoakConsumerSpec {
  std::string name;      // routing name; several specs with one name are replicas
  std::string model;     // model directory
  std::string artifact;  // the producer -> this consumer artifact ("" = none)
};

struct SoakDeploymentSpec {
  std::string bin_dir;  // scd-coordinator, scd-producer, scd-consumer
  std::string dir;      // logs, address files, the secret, etcd's data
  std::string producer_model;
  std::vector<SoakConsumerSpec> consumers;
  int coordinators = 2;
  std::string transport = "grpc";  // grpc | ucx
  int prefix_cache_mb = 2;
  int consumer_capacity = 16;
  int drain_seconds = 10;         // a replaced coordinator's drain
  double transfer_timeout_s = 5;  // a consumer's wait for a stalled transfer
  // The producer in a network namespace of its own whose link can go down (bench/netns_link.h
  // NetnsNode; root): every other node then listens on the link's host address, not loopback.
  bool producer_netns = false;
  // CPU quotas (base/cpu_quota.h; root and cgroup v1): every producer, consumer or coordinator
  // process (each incarnation) in a group of its own (named as the node) that may use this many
  // CPUs; 0: unlimited. Each daemon runs one compute thread either way.
  double producer_cpus = 0, consumer_cpus = 0, coordinator_cpus = 0;
  // The quotas' period: a group that spent its quota waits up to the rest of it.
  absl::Duration cpu_period = absl::Milliseconds(100);
  // Every daemon with HTTP (--http-listen: /metrics, /health; the OpenAI API on coordinators).
  bool http = false;
  // More flags for the producer (e.g. --link-gbps to shape its links).
  std::vector<std::string> producer_flags;
};

// What /proc says of a process.
struct ProcSample {
  int fds = 0, threads = 0;
  // Of the threads, gRPC's own pools' (its executor, event engine, timer and sync-server
  // threads): gRPC sizes them by demand and keeps some of what a burst made, so they are
  // reported, not held to a level.
  int grpc_threads = 0;
  int own_threads() const { return threads - grpc_threads; }
  int64_t rss_bytes = 0;
  int64_t rss_anon_bytes = 0;  // of rss_bytes, anonymous pages (base/process_memory.h)
  bool ok = false;  // false: the process is gone or unreadable
  // Descriptors by what they are ("socket", "pipe", "anon_inode:[eventfd]", a path) and threads
  // by name (/proc/PID/task/TID/comm): what a difference from the baseline is made of.
  std::map<std::string, int> fd_kinds, thread_names;
};

// One node as the harness sees it now.
struct SoakNode {
  std::string name;  // "coordinator-0", "producer", "consumer-1", "etcd"
  SoakRole role = SoakRole::kConsumer;
  std::string model;   // a consumer's routing name, the producer's model name
  int generation = 0;  // 0 = the first process; each restart or replacement adds one
  pid_t pid = -1;
  std::string address;          // public API (coordinators, consumers); etcd's client address
  std::string control_address;  // control plane (Stats)
  std::string http_address;     // HTTP (/metrics), with SoakDeploymentSpec.http
  bool up = false;              // running and not killed
  bool frozen = false;          // SIGSTOPped
};

class SoakDeployment {
 public:
  // Starts etcd, the coordinators, the consumers and the producer, and waits until every
  // coordinator routes to every node. The failing node's log tail on error.
  static absl::StatusOr<std::unique_ptr<SoakDeployment>> Start(const SoakDeploymentSpec& spec);
  ~SoakDeployment();  // SIGTERM (then SIGKILL) to every process, etcd last

  std::vector<SoakNode> Snapshot() const;
  SoakNode Node(int index) const;
  int size() const;
  const std::string& secret() const { return secret_; }
  // The public addresses of the coordinators that are up and not frozen.
  std::vector<std::string> LiveCoordinators() const;

  // kill -9 (the process is reaped; it stays down until Restart).
  void Kill(int index);
  // Starts the node's process again (a new generation) and waits until it wrote its addresses
  // (etcd: until it answers): the time it became ready.
  absl::StatusOr<absl::Time> Restart(int index);
  void Freeze(int index);  // SIGSTOP
  void Thaw(int index);    // SIGCONT
  // A coordinator replaced: a new process starts and is ready first, then the old one is sent
  // SIGTERM and drains its open streams (waited for, up to its drain time + 10 s). The time the
  // new one became ready.
  absl::StatusOr<absl::Time> Replace(int index);
  // The producer's link down (packets either way lost) or up again; FAILED_PRECONDITION without
  // spec.producer_netns.
  absl::Status SetProducerLinkUp(bool up);

  // The node's CPU quota group's throttling so far (FAILED_PRECONDITION: it has no quota).
  absl::StatusOr<CpuGroupStat> Throttling(int index) const;
  // A node's Stats through its control plane (coordinator, producer, consumer).
  absl::StatusOr<v1::NodeStats> Stats(int index) const;
  // A coordinator's or consumer's Inference.Health (active_requests: what it routes or runs).
  absl::StatusOr<v1::HealthResponse> Health(int index) const;
  ProcSample Sample(int index) const;
  // Whether every live coordinator's ListModels shows `node` (a consumer by its public address,
  // the producer by its role) -- it is routed to -- or, `listed` false, none does any more.
  bool RoutedEverywhere(const SoakNode& node, bool listed) const;

 private:
  struct Slot {
    SoakNode node;
    std::vector<std::string> argv;  // without the per-generation address files
    ChildProcess process;
  };
  SoakDeployment() = default;
  absl::Status StartEtcd();
  absl::Status Launch(Slot& slot);  // the current generation's process, waits for its addresses
  std::vector<std::string> NodeArgv(SoakRole role, const std::string& name,
                                    const SoakConsumerSpec* consumer) const;

  SoakDeploymentSpec spec_;
  std::optional<NetnsNode> producer_ns_;  // spec_.producer_netns
  std::unique_ptr<CpuQuotaGroups> quotas_;  // when the spec asks for a quota
  double QuotaOf(SoakRole role) const;
  std::string host_ = "127.0.0.1";        // where the nodes outside producer_ns_ listen
  std::string secret_, secret_file_, registry_;
  int etcd_client_port_ = 0, etcd_peer_port_ = 0;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_DEPLOYMENT_H_
