#include "bench/soak_deployment.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/etcd_client.h"
#include "base/grpc_tls.h"
#include "base/host_port.h"
#include "base/process_memory.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "bench/serve_benchmark.h"
#include "proto/grpc_util.h"
#include "proto/inference_client.h"
#include "scd/v1/inference.grpc.pb.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

// A port free right now on every address (etcd needs fixed ports: it keeps them across
// restarts): loopback's and, with the producer in a namespace of its own, the host's veth
// address, where etcd then listens.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  if (port <= 0) return absl::InternalError("no free port");
  return port;
}

// The entries of /proc/PID/fd or /proc/PID/task, each counted under `kind(entry)`; -1 when the
// directory cannot be read.
int CountEntries(const std::string& dir, std::map<std::string, int>* kinds,
                 const std::function<std::string(const fs::path&)>& kind) {
  int n = 0;
  std::error_code error;
  for (auto it = fs::directory_iterator(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    ++n;
    ++(*kinds)[kind(it->path())];
  }
  return error ? -1 : n;
}

// The loopback TCP sockets of the network namespace by inode: "listen :PORT", or the local and
// remote ports of a connection (/proc/net/tcp and tcp6, hex fields).
struct TcpSocket {
  bool listen = false;
  int local_port = 0, remote_port = 0;
};
std::map<std::string, TcpSocket> TcpSockets(pid_t pid) {
  std::map<std::string, TcpSocket> sockets;
  for (const char* file : {"tcp", "tcp6"}) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/net/", file));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      auto port = [](const std::string& address) {
        return static_cast<int>(
            std::strtol(address.substr(address.rfind(':') + 1).c_str(), nullptr, 16));
      };
      sockets[inode] = {state == "0A", port(local), port(remote)};
    }
  }
  return sockets;
}

// The nodes' known ports by name: a public port as "coordinator-0", a control port as
// "producer control"; a restarted node's new ports get the same names, so its descriptors compare
// with its first generation's by what they connect.
std::map<int, std::string> PortNames(const std::vector<SoakNode>& nodes) {
  std::map<int, std::string> names;
  for (const SoakNode& n : nodes) {
    for (const auto& [address, suffix] :
         {std::pair{n.address, ""}, std::pair{n.control_address, " control"}}) {
      absl::StatusOr<HostPort> hp = ParseHostPort(address);
      if (hp.ok() && hp->port > 0) names[hp->port] = absl::StrCat(n.name, suffix);
    }
  }
  return names;
}

// What a descriptor is: "tcp listen P", "tcp in P" (accepted on our port P), "tcp out P" (to a
// peer's port P), with P a node's port's name ("consumer-0", "producer control") or ":PORT" (a
// transfer port), "socket" (not TCP), "pipe", "anon_inode:[eventfd]", or a file's path.
std::string FdKind(const fs::path& fd, const std::map<std::string, TcpSocket>& tcp,
                   const std::set<int>& listening, const std::map<int, std::string>& names) {
  std::error_code error;
  const std::string target = fs::read_symlink(fd, error).string();
  if (error) return "?";
  if (target.rfind("socket:[", 0) == 0) {
    auto it = tcp.find(target.substr(8, target.size() - 9));
    if (it == tcp.end()) return "socket";
    const TcpSocket& t = it->second;
    auto port = [&](int p) {
      auto name = names.find(p);
      return name != names.end() ? name->second : absl::StrCat(":", p);
    };
    if (t.listen) return absl::StrCat("tcp listen ", port(t.local_port));
    if (listening.count(t.local_port) > 0) return absl::StrCat("tcp in ", port(t.local_port));
    return absl::StrCat("tcp out ", port(t.remote_port));
  }
  const size_t colon = target.find(":[");
  if (colon != std::string::npos && target.rfind("anon_inode", 0) != 0) {
    return target.substr(0, colon);  // pipe:[123] -> pipe
  }
  return target;
}

std::string ThreadName(const fs::path& task) {
  std::ifstream comm(task / "comm");
  std::string name;
  std::getline(comm, name);
  // Numbered pool threads ("grpc_global_tim" aside) are one kind: digits dropped.
  name.erase(std::remove_if(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }),
             name.end());
  return name;
}

// gRPC's own pools, by the names it gives their threads (15 characters, digits dropped).
bool IsGrpcThread(const std::string& name) {
  return name.rfind("grpc", 0) == 0 || name == "default-executo" || name == "event_engine" ||
         name == "timer_manager" || name == "resolver-execut";
}

}  // namespace

const char* SoakRoleName(SoakRole role) {
  switch (role) {
    case SoakRole::kEtcd:
      return "etcd";
    case SoakRole::kCoordinator:
      return "coordinator";
    case SoakRole::kProducer:
      return "producer";
    case SoakRole::kConsumer:
      return "consumer";
  }
  return "?";
}

std::vector<std::string> SoakDeployment::NodeArgv(SoakRole role, const std::string& name,
                                                  const SoakConsumerSpec* consumer) const {
  const std::string& bin = spec_.bin_dir;
  std::vector<std::string> argv;
  if (role == SoakRole::kEtcd) {
    const std::string client = absl::StrCat("http://", host_, ":", etcd_client_port_);
    const std::string peer = absl::StrCat("http://", host_, ":", etcd_peer_port_);
    return {"etcd",
            "--name",
            "scd-soak",
            "--data-dir",
            spec_.dir + "/etcd-data",
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            "scd-soak=" + peer};
  }
  const bool own_ns = role == SoakRole::kProducer && producer_ns_.has_value();
  const std::string any = (own_ns ? producer_ns_->node_ip() : host_) + ":0";
  if (role == SoakRole::kCoordinator) {
    argv = {bin + "/scd-coordinator", "--listen", any, "--control-listen", any};
  } else if (role == SoakRole::kProducer) {
    argv = {bin + "/scd-producer",
            "--model",
            spec_.producer_model,
            "--control-listen",
            any,
            "--transport",
            spec_.transport,
            "--prefix-cache-mb",
            absl::StrCat(spec_.prefix_cache_mb)};
    std::vector<std::string> seen;
    for (const SoakConsumerSpec& c : spec_.consumers) {
      if (c.artifact.empty() || std::find(seen.begin(), seen.end(), c.artifact) != seen.end()) {
        continue;
      }
      seen.push_back(c.artifact);
      argv.insert(argv.end(), {"--artifact", c.artifact});
    }
  } else {
    argv = {bin + "/scd-consumer",
            "--name",
            consumer->name,
            "--model",
            consumer->model,
            "--listen",
            any,
            "--control-listen",
            any,
            "--transfer-listen",
            any,
            "--transport",
            spec_.transport,
            "--prefix-cache-mb",
            absl::StrCat(spec_.prefix_cache_mb),
            "--capacity",
            absl::StrCat(spec_.consumer_capacity),
            "--transfer-timeout",
            absl::StrCat(spec_.transfer_timeout_s)};
    if (!consumer->artifact.empty()) argv.insert(argv.end(), {"--artifact", consumer->artifact});
  }
  (void)name;
  if (role == SoakRole::kProducer) {
    argv.insert(argv.end(), spec_.producer_flags.begin(), spec_.producer_flags.end());
  }
  if (spec_.http) argv.insert(argv.end(), {"--http-listen", any});
  if (role != SoakRole::kCoordinator) argv.insert(argv.end(), {"--threads", "1"});
  argv.insert(argv.end(),
              {"--registry", registry_, "--cluster-secret-file", secret_file_, "--drain-seconds",
               absl::StrCat(spec_.drain_seconds), "--log-level", "info"});
  return own_ns ? producer_ns_->Inside(std::move(argv)) : argv;
}

double SoakDeployment::QuotaOf(SoakRole role) const {
  switch (role) {
    case SoakRole::kProducer:
      return spec_.producer_cpus;
    case SoakRole::kConsumer:
      return spec_.consumer_cpus;
    case SoakRole::kCoordinator:
      return spec_.coordinator_cpus;
    case SoakRole::kEtcd:
      return 0;
  }
  return 0;
}

absl::StatusOr<CpuGroupStat> SoakDeployment::Throttling(int index) const {
  const SoakNode node = Node(index);
  if (QuotaOf(node.role) <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(node.name, " has no CPU quota"));
  }
  return quotas_->Stat(node.name);
}

absl::StatusOr<std::unique_ptr<SoakDeployment>> SoakDeployment::Start(
    const SoakDeploymentSpec& spec) {
  if (spec.consumers.empty()) return absl::InvalidArgumentError("a soak needs consumers");
  if (spec.coordinators < 1) return absl::InvalidArgumentError("a soak needs a coordinator");
  std::unique_ptr<SoakDeployment> d(new SoakDeployment());
  d->spec_ = spec;
  if (spec.producer_cpus > 0 || spec.consumer_cpus > 0 || spec.coordinator_cpus > 0) {
    SCD_ASSIGN_OR_RETURN(d->quotas_, CpuQuotaGroups::Create());
  }
  fs::create_directories(spec.dir);
  fs::remove_all(spec.dir + "/etcd-data");
  d->secret_file_ = spec.dir + "/cluster-secret";
  d->secret_ = RandomId128() + RandomId128();
  std::ofstream(d->secret_file_) << d->secret_ << "\n";
  fs::permissions(d->secret_file_, fs::perms::owner_read | fs::perms::owner_write);
  SCD_ASSIGN_OR_RETURN(d->etcd_client_port_, FreePort());
  do {
    SCD_ASSIGN_OR_RETURN(d->etcd_peer_port_, FreePort());
  } while (d->etcd_peer_port_ == d->etcd_client_port_);
  if (spec.producer_netns) {
    SCD_ASSIGN_OR_RETURN(NetnsNode ns, NetnsNode::Create());
    d->producer_ns_.emplace(std::move(ns));
    d->host_ = d->producer_ns_->host_ip();
  }
  d->registry_ = absl::StrCat("etcd://", d->host_, ":", d->etcd_client_port_);

  auto add = [&](SoakRole role, const std::string& name, const std::string& model,
                 const SoakConsumerSpec* consumer) {
    auto slot = std::make_unique<Slot>();
    slot->node.name = name;
    slot->node.role = role;
    slot->node.model = model;
    slot->argv = d->NodeArgv(role, name, consumer);
    std::lock_guard<std::mutex> lock(d->mu_);
    d->slots_.push_back(std::move(slot));
    return d->slots_.size() - 1;
  };
  add(SoakRole::kEtcd, "etcd", "", nullptr);
  for (int i = 0; i < spec.coordinators; ++i) {
    add(SoakRole::kCoordinator, absl::StrCat("coordinator-", i), "", nullptr);
  }
  add(SoakRole::kProducer, "producer", fs::path(spec.producer_model).filename().string(), nullptr);
  for (size_t i = 0; i < spec.consumers.size(); ++i) {
    add(SoakRole::kConsumer, absl::StrCat("consumer-", i), spec.consumers[i].name,
        &spec.consumers[i]);
  }
  for (int i = 0; i < d->size(); ++i) {
    Slot* slot = nullptr;
    {
      std::lock_guard<std::mutex> lock(d->mu_);
      slot = d->slots_[static_cast<size_t>(i)].get();
    }
    SCD_RETURN_IF_ERROR(d->Launch(*slot));
  }
  // Serving once every coordinator routes to every node.
  const absl::Time limit = absl::Now() + absl::Seconds(90);
  for (;;) {
    bool all = true;
    for (const SoakNode& node : d->Snapshot()) {
      if (node.role == SoakRole::kProducer || node.role == SoakRole::kConsumer) {
        all = all && d->RoutedEverywhere(node, true);
      }
    }
    if (all) break;
    if (absl::Now() > limit) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the soak's nodes were not all routed to within 90 s (logs in ", spec.dir, ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return d;
}

absl::Status SoakDeployment::Launch(Slot& slot) {
  const std::string base = absl::StrCat(spec_.dir, "/", slot.node.name, ".", slot.node.generation);
  std::vector<std::string> argv = slot.argv;
  const bool daemon = slot.node.role != SoakRole::kEtcd;
  if (daemon) {
    fs::remove(base + ".addr");
    fs::remove(base + ".control.addr");
    argv.insert(argv.end(), {"--address-file", base + ".addr", "--control-address-file",
                             base + ".control.addr"});
    if (spec_.http) {
      fs::remove(base + ".http.addr");
      argv.insert(argv.end(), {"--http-address-file", base + ".http.addr"});
    }
  }
  SCD_ASSIGN_OR_RETURN(ChildProcess process, ChildProcess::Start(argv, base + ".log"));
  if (QuotaOf(slot.node.role) > 0) {
    SCD_RETURN_IF_ERROR(
        quotas_->Place(process.pid(), slot.node.name, QuotaOf(slot.node.role), spec_.cpu_period));
  }
  std::string address, control, http;
  if (daemon) {
    if (slot.node.role != SoakRole::kProducer) {
      SCD_ASSIGN_OR_RETURN(address, process.WaitForFile(base + ".addr", absl::Seconds(60)));
    }
    SCD_ASSIGN_OR_RETURN(control, process.WaitForFile(base + ".control.addr", absl::Seconds(60)));
    if (spec_.http) {
      SCD_ASSIGN_OR_RETURN(http, process.WaitForFile(base + ".http.addr", absl::Seconds(60)));
    }
  } else {
    address = absl::StrCat(host_, ":", etcd_client_port_);
    SCD_ASSIGN_OR_RETURN(EtcdClient client, EtcdClient::Create(registry_));
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (!client.Range("/").ok()) {
      if (absl::Now() > limit || !process.running()) {
        return absl::UnavailableError(
            absl::StrCat("etcd did not answer within 30 s; its log ends:\n", process.LogTail()));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  slot.node.pid = process.pid();
  slot.node.address = address;
  slot.node.control_address = control;
  slot.node.http_address = http;
  slot.node.up = true;
  slot.node.frozen = false;
  slot.process = std::move(process);
  return absl::OkStatus();
}

SoakDeployment::~SoakDeployment() {
  std::vector<std::unique_ptr<Slot>> slots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots.swap(slots_);
  }
  // Thaw first: a stopped process cannot take SIGTERM's handler.
  for (auto& slot : slots) {
    if (slot->node.frozen) slot->process.Signal(SIGCONT);
  }
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    if ((*it)->node.role != SoakRole::kEtcd) (*it)->process.Terminate(absl::Seconds(15));
  }
  for (auto& slot : slots) slot->process.Terminate(absl::Seconds(10));
}

std::vector<SoakNode> SoakDeployment::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SoakNode> nodes;
  for (const auto& slot : slots_) nodes.push_back(slot->node);
  return nodes;
}

SoakNode SoakDeployment::Node(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.at(static_cast<size_t>(index))->node;
}

int SoakDeployment::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(slots_.size());
}

std::vector<std::string> SoakDeployment::LiveCoordinators() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& slot : slots_) {
    const SoakNode& n = slot->node;
    if (n.role == SoakRole::kCoordinator && n.up && !n.frozen) out.push_back(n.address);
  }
  return out;
}

void SoakDeployment::Kill(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = *slots_.at(static_cast<size_t>(index));
  slot.process.Signal(SIGKILL);
  slot.process.Wait(absl::Seconds(10));
  slot.node.up = false;
  slot.node.frozen = false;
  slot.node.pid = -1;
}

absl::StatusOr<absl::Time> SoakDeployment::Restart(int index) {
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot = slots_.at(static_cast<size_t>(index)).get();
    if (slot->node.up) return absl::FailedPreconditionError(slot->node.name + " is still up");
    ++slot->node.generation;
  }
  SCD_RETURN_IF_ERROR(Launch(*slot));
  return absl::Now();
}

void SoakDeployment::Freeze(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = *slots_.at(static_cast<size_t>(index));
  slot.process.Signal(SIGSTOP);
  slot.node.frozen = true;
}

void SoakDeployment::Thaw(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = *slots_.at(static_cast<size_t>(index));
  slot.process.Signal(SIGCONT);
  slot.node.frozen = false;
}

absl::StatusOr<absl::Time> SoakDeployment::Replace(int index) {
  auto fresh = std::make_unique<Slot>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Slot& old = *slots_.at(static_cast<size_t>(index));
    fresh->node = old.node;
    fresh->argv = old.argv;
    ++fresh->node.generation;
  }
  SCD_RETURN_IF_ERROR(Launch(*fresh));
  const absl::Time ready = absl::Now();
  std::unique_ptr<Slot> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(slots_.at(static_cast<size_t>(index)));
    slots_.at(static_cast<size_t>(index)) = std::move(fresh);
  }
  old->process.Terminate(absl::Seconds(spec_.drain_seconds + 10));
  return ready;
}

absl::Status SoakDeployment::SetProducerLinkUp(bool up) {
  if (!producer_ns_.has_value()) {
    return absl::FailedPreconditionError("the producer has no link of its own (--link netns)");
  }
  return producer_ns_->SetLinkUp(up);
}

absl::StatusOr<v1::NodeStats> SoakDeployment::Stats(int index) const {
  const SoakNode node = Node(index);
  if (node.role == SoakRole::kEtcd) return absl::InvalidArgumentError("etcd has no Stats");
  return ReadNodeStats(node.control_address, secret_);
}

absl::StatusOr<v1::HealthResponse> SoakDeployment::Health(int index) const {
  const SoakNode node = Node(index);
  auto stub = v1::Inference::NewStub(NewGrpcChannel(node.address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::HealthResponse response;
  const grpc::Status status = stub->Health(&context, v1::HealthRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

ProcSample SoakDeployment::Sample(int index) const {
  const SoakNode node = Node(index);
  ProcSample sample;
  if (!node.up || node.pid <= 0) return sample;
  const std::map<std::string, TcpSocket> tcp = TcpSockets(node.pid);
  std::set<int> listening;
  for (const auto& [inode, socket] : tcp) {
    if (socket.listen) listening.insert(socket.local_port);
  }
  const std::map<int, std::string> names = PortNames(Snapshot());
  sample.fds = CountEntries(absl::StrCat("/proc/", node.pid, "/fd"), &sample.fd_kinds,
                            [&](const fs::path& fd) { return FdKind(fd, tcp, listening, names); });
  sample.threads =
      CountEntries(absl::StrCat("/proc/", node.pid, "/task"), &sample.thread_names, ThreadName);
  for (const auto& [name, n] : sample.thread_names) {
    if (IsGrpcThread(name)) sample.grpc_threads += n;
  }
  const ResidentMemory memory = ResidentOf(node.pid);
  sample.rss_bytes = memory.total;
  sample.rss_anon_bytes = memory.anon;
  sample.ok = sample.fds >= 0 && sample.threads >= 0 && sample.rss_bytes >= 0;
  return sample;
}

bool SoakDeployment::RoutedEverywhere(const SoakNode& node, bool listed) const {
  for (const std::string& coordinator : LiveCoordinators()) {
    absl::StatusOr<std::vector<v1::ModelInfo>> models = ListModels(coordinator, absl::Seconds(2));
    if (!models.ok()) return false;
    bool found = false;
    for (const v1::ModelInfo& m : *models) {
      found = found || (node.role == SoakRole::kProducer ? m.role() == "producer"
                                                         : m.address() == node.address);
    }
    if (found != listed) return false;
  }
  return true;
}

}  // namespace scd::bench
