#include "bench/netns_link.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/child_process.h"
#include "base/status_macros.h"

namespace scd::bench {
namespace {

constexpr char kPrefix[] = "scdb";  // every namespace and link this tool makes starts so

// Runs a command; its output on failure.
absl::Status Cmd(std::vector<std::string> argv) {
  const std::string shown = absl::StrJoin(argv, " ");
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run(std::move(argv), absl::Seconds(30));
  if (!run.ok()) return run.status();
  if (run->status != 0) {
    return absl::InternalError(absl::StrCat("`", shown, "` failed: ", run->output));
  }
  return absl::OkStatus();
}

void Quiet(std::vector<std::string> argv) { (void)Cmd(std::move(argv)); }

// Root and iproute2 (for `--link netns`, in the sweep and the soak), then the namespaces of
// earlier runs whose process is gone (killed before it could clean up) removed.
absl::Status Prepare() {
  if (geteuid() != 0) {
    return absl::PermissionDeniedError(
        "--link netns makes network namespaces and needs root (CAP_NET_ADMIN); run as root or "
        "use --link shaper");
  }
  absl::StatusOr<ChildProcess::Outcome> ip = ChildProcess::Run({"ip", "-V"});
  if (!ip.ok() || ip->status != 0) {
    return absl::FailedPreconditionError(
        "--link netns needs iproute2's `ip` and `tc` (apt-get install iproute2)");
  }
  for (const std::string& name : NetnsLink::Leftovers()) {
    int pid = 0;
    absl::string_view digits = absl::StripPrefix(name, kPrefix);
    digits = digits.substr(0, digits.size() - 1);  // the trailing role letter
    if (absl::SimpleAtoi(digits, &pid) && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      Quiet({"ip", "netns", "del", name});
    }
  }
  return absl::OkStatus();
}

// Runs `steps` in order; the first failure's message.
absl::Status RunSteps(const std::vector<std::vector<std::string>>& steps) {
  for (const std::vector<std::string>& step : steps) SCD_RETURN_IF_ERROR(Cmd(step));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> NetnsLink::Leftovers() {
  std::vector<std::string> names;
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run({"ip", "netns", "list"});
  if (!run.ok() || run->status != 0) return names;
  for (absl::string_view line : absl::StrSplit(run->output, '\n', absl::SkipEmpty())) {
    const std::string name(line.substr(0, line.find(' ')));
    if (absl::StartsWith(name, kPrefix)) names.push_back(name);
  }
  return names;
}

absl::StatusOr<NetnsLink> NetnsLink::Create() {
  SCD_RETURN_IF_ERROR(Prepare());
  const int pid = static_cast<int>(getpid());
  const int subnet = pid % 250 + 1;
  NetnsLink link;
  link.owned_ = true;
  link.producer_ns_ = absl::StrCat(kPrefix, pid, "p");
  link.consumer_ns_ = absl::StrCat(kPrefix, pid, "c");
  link.producer_dev_ = absl::StrCat(kPrefix, pid, "p");
  const std::string consumer_dev = absl::StrCat(kPrefix, pid, "c");
  link.caller_dev_ = absl::StrCat(kPrefix, pid, "h");
  const std::string caller_peer = absl::StrCat(kPrefix, pid, "g");
  link.producer_ip_ = absl::StrCat("10.213.", subnet, ".1");
  link.consumer_ip_ = absl::StrCat("10.213.", subnet, ".2");
  const std::string caller_ip = absl::StrCat("10.214.", subnet, ".1");
  link.caller_peer_ip_ = absl::StrCat("10.214.", subnet, ".2");
  const std::string& p = link.producer_ns_;
  const std::string& c = link.consumer_ns_;
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "netns", "add", p},
      {"ip", "netns", "add", c},
      {"ip", "link", "add", link.producer_dev_, "type", "veth", "peer", "name", consumer_dev},
      {"ip", "link", "set", link.producer_dev_, "netns", p},
      {"ip", "link", "set", consumer_dev, "netns", c},
      {"ip", "-n", p, "addr", "add", link.producer_ip_ + "/24", "dev", link.producer_dev_},
      {"ip", "-n", c, "addr", "add", link.consumer_ip_ + "/24", "dev", consumer_dev},
      {"ip", "-n", p, "link", "set", link.producer_dev_, "up"},
      {"ip", "-n", c, "link", "set", consumer_dev, "up"},
      {"ip", "-n", p, "link", "set", "lo", "up"},
      {"ip", "-n", c, "link", "set", "lo", "up"},
      {"ip", "link", "add", link.caller_dev_, "type", "veth", "peer", "name", caller_peer},
      {"ip", "link", "set", caller_peer, "netns", c},
      {"ip", "addr", "add", caller_ip + "/24", "dev", link.caller_dev_},
      {"ip", "-n", c, "addr", "add", link.caller_peer_ip_ + "/24", "dev", caller_peer},
      {"ip", "link", "set", link.caller_dev_, "up"},
      {"ip", "-n", c, "link", "set", caller_peer, "up"},
  };
  if (absl::Status s = RunSteps(steps); !s.ok()) {
    link.Remove();  // nothing half-made stays
    return absl::FailedPreconditionError(
        absl::StrCat("could not build the namespaces for --link netns: ", s.message()));
  }
  return link;
}

void NetnsLink::RemoveAllOf(int pid) {
  Quiet({"ip", "netns", "del", absl::StrCat(kPrefix, pid, "p")});
  Quiet({"ip", "netns", "del", absl::StrCat(kPrefix, pid, "c")});
  Quiet({"ip", "link", "del", absl::StrCat(kPrefix, pid, "h")});
  Quiet({"ip", "netns", "del", absl::StrCat(kPrefix, pid, "n")});  // a NetnsNode's
}

NetnsLink::NetnsLink(NetnsLink&& other) noexcept
    : producer_ns_(std::move(other.producer_ns_)),
      consumer_ns_(std::move(other.consumer_ns_)),
      producer_dev_(std::move(other.producer_dev_)),
      producer_ip_(std::move(other.producer_ip_)),
      consumer_ip_(std::move(other.consumer_ip_)),
      caller_peer_ip_(std::move(other.caller_peer_ip_)),
      caller_dev_(std::move(other.caller_dev_)),
      owned_(std::exchange(other.owned_, false)) {}

NetnsLink::~NetnsLink() { Remove(); }

void NetnsLink::Remove() {
  if (!owned_) return;
  owned_ = false;
  // Deleting a namespace deletes the veth ends in it, and with them their peers.
  Quiet({"ip", "netns", "del", producer_ns_});
  Quiet({"ip", "netns", "del", consumer_ns_});
  Quiet({"ip", "link", "del", caller_dev_});
}

absl::Status NetnsLink::Shape(double gbps, double latency_us) {
  const std::vector<std::string> tc = {"ip", "netns", "exec", producer_ns_, "tc", "qdisc"};
  auto with = [&](std::vector<std::string> rest) {
    std::vector<std::string> argv = tc;
    argv.insert(argv.end(), rest.begin(), rest.end());
    return argv;
  };
  Quiet(with({"del", "dev", producer_dev_, "root"}));
  const bool rate = gbps > 0 && std::isfinite(gbps);
  std::string parent = "root";
  if (latency_us > 0) {
    absl::Status s = Cmd(with({"add", "dev", producer_dev_, "root", "handle", "1:", "netem",
                               "delay", absl::StrCat(static_cast<int64_t>(latency_us), "us")}));
    if (!s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--link netns cannot add latency: this kernel has no netem qdisc (sch_netem); use "
          "--latency-us 0 or --link shaper (",
          s.message(), ")"));
    }
    parent = "1:";
  }
  if (!rate) return absl::OkStatus();
  // A token bucket of the shaper's 64 KiB burst; the queue holds 200 ms at the rate (TCP's
  // congestion control sees the rate, not drops, below that).
  const double bytes_per_s = gbps * 1e9 / 8;
  const int64_t limit = static_cast<int64_t>(std::max(256.0 * 1024, bytes_per_s * 0.2));
  std::vector<std::string> add = {"add", "dev", producer_dev_};
  if (parent == "root") {
    add.push_back("root");
  } else {
    add.insert(add.end(), {"parent", parent, "handle", "2:"});
  }
  add.insert(add.end(), {"tbf", "rate", absl::StrCat(static_cast<int64_t>(gbps * 1e9), "bit"),
                         "burst", "65536", "limit", absl::StrCat(limit)});
  return Cmd(with(add));
}

std::vector<std::string> NetnsLink::InProducer(std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"ip", "netns", "exec", producer_ns_});
  return argv;
}

std::vector<std::string> NetnsLink::InConsumer(std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"ip", "netns", "exec", consumer_ns_});
  return argv;
}

absl::StatusOr<NetnsNode> NetnsNode::Create() {
  SCD_RETURN_IF_ERROR(Prepare());
  const int pid = static_cast<int>(getpid());
  NetnsNode node;
  node.owned_ = true;
  node.ns_ = absl::StrCat(kPrefix, pid, "n");
  node.node_dev_ = node.ns_;
  node.host_dev_ = absl::StrCat(kPrefix, pid, "m");
  const std::string net = absl::StrCat("10.215.", pid % 250 + 1, ".");
  node.host_ip_ = net + "1";
  node.node_ip_ = net + "2";
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "netns", "add", node.ns_},
      {"ip", "link", "add", node.host_dev_, "type", "veth", "peer", "name", node.node_dev_},
      {"ip", "link", "set", node.node_dev_, "netns", node.ns_},
      {"ip", "addr", "add", node.host_ip_ + "/24", "dev", node.host_dev_},
      {"ip", "-n", node.ns_, "addr", "add", node.node_ip_ + "/24", "dev", node.node_dev_},
      {"ip", "link", "set", node.host_dev_, "up"},
      {"ip", "-n", node.ns_, "link", "set", node.node_dev_, "up"},
      {"ip", "-n", node.ns_, "link", "set", "lo", "up"},
  };
  if (absl::Status s = RunSteps(steps); !s.ok()) {
    node.Remove();  // nothing half-made stays
    return absl::FailedPreconditionError(
        absl::StrCat("could not build a node's namespace for --link netns: ", s.message()));
  }
  return node;
}

NetnsNode::NetnsNode(NetnsNode&& other) noexcept
    : ns_(std::move(other.ns_)),
      node_dev_(std::move(other.node_dev_)),
      host_dev_(std::move(other.host_dev_)),
      host_ip_(std::move(other.host_ip_)),
      node_ip_(std::move(other.node_ip_)),
      owned_(std::exchange(other.owned_, false)) {}

NetnsNode::~NetnsNode() { Remove(); }

void NetnsNode::Remove() {
  if (!owned_) return;
  owned_ = false;
  Quiet({"ip", "netns", "del", ns_});  // deletes the node's end, and with it the host's
  Quiet({"ip", "link", "del", host_dev_});
}

absl::Status NetnsNode::SetLinkUp(bool up) {
  return Cmd({"ip", "-n", ns_, "link", "set", node_dev_, up ? "up" : "down"});
}

std::vector<std::string> NetnsNode::Inside(std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"ip", "netns", "exec", ns_});
  return argv;
}

}  // namespace scd::bench
