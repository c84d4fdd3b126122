#include "bench/sweep_deployment.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "proto/inference_client.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

struct ConsumerSpec {
  std::string name, path, artifact;
};

absl::StatusOr<ConsumerSpec> ParseConsumer(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--consumer ", text, ": expected NAME=DIR|CONFIG[:ARTIFACT]"));
  }
  ConsumerSpec c;
  c.name = text.substr(0, eq);
  const std::string rest = text.substr(eq + 1);
  const size_t colon = rest.find(':');
  c.path = rest.substr(0, colon);
  if (colon != std::string::npos) c.artifact = rest.substr(colon + 1);
  return c;
}

// --model DIR or --dummy-weights CONFIG [--layers N] for a daemon.
void AddModel(std::vector<std::string>* argv, const std::string& path, int64_t layers) {
  const bool dummy = fs::is_regular_file(path);
  argv->insert(argv->end(), {dummy ? "--dummy-weights" : "--model", path});
  if (dummy && layers > 0) argv->insert(argv->end(), {"--layers", absl::StrCat(layers)});
}

// "0.0.0.0:1234" -> "1234".
std::string Port(const std::string& address) { return address.substr(address.rfind(':') + 1); }

// `taskset -c CPUS ARGV... --threads N` (N = the list's size), or argv itself with no list.
absl::StatusOr<std::vector<std::string>> Pinned(std::vector<std::string> argv,
                                                const std::string& cpus) {
  if (cpus.empty()) return argv;
  SCD_ASSIGN_OR_RETURN(int n, CountCpus(cpus));
  argv.insert(argv.end(), {"--threads", absl::StrCat(n)});
  argv.insert(argv.begin(), {"taskset", "-c", cpus});
  return argv;
}

}  // namespace

absl::StatusOr<int> CountCpus(const std::string& list) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_ZERO(&allowed);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("CPU list '", list, "': ", why));
  };
  std::vector<bool> seen(CPU_SETSIZE, false);
  int count = 0;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo) || (ends.size() == 2 && !absl::SimpleAtoi(ends[1], &hi))) {
      return bad("expected CPU numbers and ranges, as 0 or 2-3 or 0,2");
    }
    if (ends.size() == 1) hi = lo;
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return bad(absl::StrCat("bad range '", part, "'"));
    for (int cpu = lo; cpu <= hi; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed)) {
        return bad(absl::StrCat(
            "CPU ", cpu, " is not one this process may run on (nproc: ", CPU_COUNT(&allowed), ")"));
      }
      if (!seen[static_cast<size_t>(cpu)]) ++count;
      seen[static_cast<size_t>(cpu)] = true;
    }
  }
  return count;
}

absl::StatusOr<std::unique_ptr<SweepDeployment>> SweepDeployment::Start(
    const DeploymentSpec& spec) {
  std::unique_ptr<SweepDeployment> d(new SweepDeployment());
  fs::create_directories(spec.dir);
  d->secret_file_ = spec.dir + "/cluster-secret";
  d->secret_ = RandomId128() + RandomId128();
  {
    std::ofstream secret(d->secret_file_);
    secret << d->secret_ << "\n";
  }
  fs::permissions(d->secret_file_, fs::perms::owner_read | fs::perms::owner_write);
  d->fidelity_ = fs::is_directory(spec.producer);
  for (const std::string& text : spec.consumers) {
    SCD_ASSIGN_OR_RETURN(ConsumerSpec c, ParseConsumer(text));
    d->names_.push_back(c.name);
    d->fidelity_ = d->fidelity_ && fs::is_directory(c.path);
  }
  if (spec.producer_cpus.empty() != spec.consumer_cpus.empty()) {
    return absl::InvalidArgumentError("give both CPU lists (producer and consumer) or neither");
  }
  for (const std::string* cpus : {&spec.producer_cpus, &spec.consumer_cpus}) {
    if (!cpus->empty()) SCD_RETURN_IF_ERROR(CountCpus(*cpus).status());
  }
  const bool daemons = spec.netns || !spec.producer_cpus.empty();
  SCD_RETURN_IF_ERROR(daemons ? d->StartDaemons(spec) : d->StartAllInOne(spec));
  // Serving once every model is routable.
  const absl::Time limit = absl::Now() + absl::Minutes(10);
  for (;;) {
    auto models = ListModels(d->server_, absl::Seconds(2));
    if (models.ok() && models->size() == d->names_.size() + 1) break;
    for (ChildProcess& p : d->processes_) {
      if (!p.running()) {
        return absl::FailedPreconditionError(
            absl::StrCat("a node of the sweep's deployment exited; its log (", p.log(), ") ends:\n",
                         p.LogTail()));
      }
    }
    if (absl::Now() > limit) {
      return absl::DeadlineExceededError("the sweep's nodes did not all register in 10 minutes");
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return d;
}

absl::Status SweepDeployment::StartAllInOne(const DeploymentSpec& spec) {
  const std::string addr = spec.dir + "/server.addr", control = spec.dir + "/server.control.addr";
  fs::remove(addr);
  fs::remove(control);
  std::vector<std::string> argv = {spec.bin_dir + "/scd",
                                   "serve",
                                   "--all-in-one",
                                   "--producer-model",
                                   spec.producer,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--address-file",
                                   addr,
                                   "--control-address-file",
                                   control,
                                   "--cluster-secret-file",
                                   secret_file_,
                                   "--log-level",
                                   "info"};
  if (spec.layers > 0) argv.insert(argv.end(), {"--layers", absl::StrCat(spec.layers)});
  for (const std::string& c : spec.consumers) argv.insert(argv.end(), {"--consumer", c});
  SCD_ASSIGN_OR_RETURN(ChildProcess server, ChildProcess::Start(argv, spec.dir + "/server.log"));
  processes_.push_back(std::move(server));
  SCD_ASSIGN_OR_RETURN(server_, processes_.back().WaitForFile(addr, absl::Minutes(10)));
  SCD_ASSIGN_OR_RETURN(control_, processes_.back().WaitForFile(control, absl::Seconds(30)));
  return absl::OkStatus();
}

absl::Status SweepDeployment::StartDaemons(const DeploymentSpec& spec) {
  if (spec.netns) {
    SCD_ASSIGN_OR_RETURN(NetnsLink link, NetnsLink::Create());
    netns_.emplace(std::move(link));
  }
  NetnsLink* n = netns_ ? &*netns_ : nullptr;
  const std::string loopback = "127.0.0.1";
  const std::string producer_ip = n ? n->producer_ip() : loopback;
  const std::string consumer_ip = n ? n->consumer_ip() : loopback;
  auto start = [&](std::vector<std::string> argv, const std::string& name,
                   bool producer_side) -> absl::StatusOr<ChildProcess*> {
    const std::string addr = spec.dir + "/" + name + ".addr";
    const std::string control = spec.dir + "/" + name + ".control.addr";
    fs::remove(addr);
    fs::remove(control);
    argv.insert(argv.end(), {"--address-file", addr, "--control-address-file", control,
                             "--cluster-secret-file", secret_file_, "--log-level", "info"});
    const bool computes = name != "coordinator";
    if (computes) {
      SCD_ASSIGN_OR_RETURN(
          argv, Pinned(std::move(argv), producer_side ? spec.producer_cpus : spec.consumer_cpus));
    } else if (!spec.consumer_cpus.empty()) {
      argv.insert(argv.begin(), {"taskset", "-c", spec.consumer_cpus});
    }
    if (n) argv = producer_side ? n->InProducer(argv) : n->InConsumer(argv);
    SCD_ASSIGN_OR_RETURN(ChildProcess p, ChildProcess::Start(argv, spec.dir + "/" + name + ".log"));
    processes_.push_back(std::move(p));
    return &processes_.back();
  };
  // The coordinator on the consumer's side, on every address there: under netns the producer
  // dials it over the shaped pair, this process over its own pair.
  SCD_ASSIGN_OR_RETURN(
      ChildProcess * coordinator,
      start({spec.bin_dir + "/scd-coordinator", "--listen", (n ? "0.0.0.0" : loopback) + ":0",
             "--control-listen", (n ? "0.0.0.0" : loopback) + ":0"},
            "coordinator", false));
  SCD_ASSIGN_OR_RETURN(std::string public_address,
                       coordinator->WaitForFile(spec.dir + "/coordinator.addr", absl::Seconds(60)));
  SCD_ASSIGN_OR_RETURN(
      std::string control_address,
      coordinator->WaitForFile(spec.dir + "/coordinator.control.addr", absl::Seconds(30)));
  const std::string caller_ip = n ? n->consumer_ip_from_caller() : loopback;
  server_ = caller_ip + ":" + Port(public_address);
  control_ = caller_ip + ":" + Port(control_address);
  const std::string registry = consumer_ip + ":" + Port(control_address);
  std::vector<std::string> producer = {spec.bin_dir + "/scd-producer",
                                       "--control-listen",
                                       producer_ip + ":0",
                                       "--coordinator",
                                       registry,
                                       "--transport",
                                       "grpc"};
  AddModel(&producer, spec.producer, spec.layers);
  int index = 0;
  for (const std::string& text : spec.consumers) {
    SCD_ASSIGN_OR_RETURN(ConsumerSpec c, ParseConsumer(text));
    if (!c.artifact.empty()) producer.insert(producer.end(), {"--artifact", c.artifact});
    std::vector<std::string> consumer = {spec.bin_dir + "/scd-consumer",
                                         "--name",
                                         c.name,
                                         "--listen",
                                         consumer_ip + ":0",
                                         "--control-listen",
                                         consumer_ip + ":0",
                                         "--transfer-listen",
                                         consumer_ip + ":0",
                                         "--coordinator",
                                         registry,
                                         "--transport",
                                         "grpc"};
    AddModel(&consumer, c.path, spec.layers);
    if (!c.artifact.empty()) consumer.insert(consumer.end(), {"--artifact", c.artifact});
    SCD_RETURN_IF_ERROR(start(consumer, absl::StrCat("consumer-", index++), false).status());
  }
  SCD_RETURN_IF_ERROR(start(producer, "producer", true).status());
  return absl::OkStatus();
}

SweepDeployment::~SweepDeployment() {
  for (auto it = processes_.rbegin(); it != processes_.rend(); ++it) {
    it->Terminate(absl::Seconds(10));
  }
  processes_.clear();
  netns_.reset();  // after every process in it has stopped
}

}  // namespace scd::bench
