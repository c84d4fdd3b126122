#include "bench/sim_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "bench/bounded_toml.h"
#include "bench/sim_faults.h"

namespace scd::bench {
namespace {

using F = TomlField;

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// A path as written in a file, joined to the file's folder unless absolute.
std::string JoinedPath(const std::string& path, const std::string& dir) {
  const std::filesystem::path p(path);
  return p.is_absolute() || dir.empty() ? path : (std::filesystem::path(dir) / p).string();
}

// Calls `read(table, name)` for each table of the array of tables at `node` ("pool[2]" names).
absl::Status ForEachTable(
    const toml::node& node, const std::string& key,
    const std::function<absl::Status(const toml::table&, const std::string&)>& read) {
  const toml::array* array = node.as_array();
  if (array == nullptr) return Invalid(absl::StrCat(key, ": an array of tables ([[", key, "]])"));
  if (static_cast<int64_t>(array->size()) > kMaxSimPools) {
    return Invalid(absl::StrCat(key, ": more than ", kMaxSimPools));
  }
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string name = absl::StrCat(key, "[", i, "]");
    const toml::table* table = (*array)[i].as_table();
    if (table == nullptr) return Invalid(absl::StrCat(name, " is not a table"));
    if (absl::Status s = read(*table, name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Reads one table of the root into `fields` (unknown: INVALID_ARGUMENT naming it).
absl::Status ReadSection(const toml::node& node, const std::string& key, const TomlFields& fields) {
  absl::StatusOr<const toml::table*> table = TomlTableAt(node, key);
  if (!table.ok()) return table.status();
  return ReadTomlTable(**table, key, fields);
}

absl::Status NeedName(const std::string& name, const std::string& where,
                      std::set<std::string>* seen) {
  if (name.empty()) return Invalid(absl::StrCat(where, ".name: needed"));
  if (!seen->insert(name).second) return Invalid(absl::StrCat(where, ": '", name, "' twice"));
  return absl::OkStatus();
}

absl::Status LoadProfile(const std::string& where, const std::string& path, const std::string& dir,
                         NodeRole role, const ProfileLoader& load, NodeProfile* out) {
  if (path.empty()) return Invalid(absl::StrCat(where, ".profile: needed"));
  const std::string full = JoinedPath(path, dir);
  absl::StatusOr<NodeProfile> profile = load ? load(full) : ReadNodeProfile(full);
  if (!profile.ok()) {
    return Invalid(absl::StrCat(where, ".profile: ", profile.status().message()));
  }
  if (profile->role != role) {
    return Invalid(absl::StrCat(where, ".profile: ", full, " is a ", NodeRoleName(profile->role),
                                "'s, not a ", NodeRoleName(role), "'s"));
  }
  *out = *std::move(profile);
  return absl::OkStatus();
}

absl::Status ReadPools(const toml::table& root, const std::string& dir, const ProfileLoader& load,
                       SimDeployment* d) {
  std::set<std::string> names;
  if (const toml::node* node = root.get("producer_pool")) {
    SCD_RETURN_IF_ERROR(
        ForEachTable(*node, "producer_pool", [&](const toml::table& t, const std::string& where) {
          SimProducerPool p;
          SCD_RETURN_IF_ERROR(
              ReadTomlTable(t, where,
                            {{"name", F::Text(&p.name)},
                             {"profile", F::Text(&p.profile)},
                             {"count", F::Integer(&p.count, 1, kMaxSimNodes)},
                             {"prefix_cache_mb", F::Number(&p.prefix_cache_mb, 0, 1e9)},
                             {"prefill_threads", F::Integer(&p.prefill_threads, 1, 1024)},
                             {"restart_s", F::Number(&p.restart_s, 0, 3600)}}));
          SCD_RETURN_IF_ERROR(NeedName(p.name, where, &names));
          SCD_RETURN_IF_ERROR(
              LoadProfile(where, p.profile, dir, NodeRole::kProducer, load, &p.costs));
          d->producers.push_back(std::move(p));
          return absl::OkStatus();
        }));
  }
  if (const toml::node* node = root.get("consumer_pool")) {
    SCD_RETURN_IF_ERROR(
        ForEachTable(*node, "consumer_pool", [&](const toml::table& t, const std::string& where) {
          SimConsumerPool c;
          SCD_RETURN_IF_ERROR(
              ReadTomlTable(t, where,
                            {{"name", F::Text(&c.name)},
                             {"profile", F::Text(&c.profile)},
                             {"count", F::Integer(&c.count, 1, kMaxSimNodes)},
                             {"prefix_cache_mb", F::Number(&c.prefix_cache_mb, 0, 1e9)},
                             {"producer", F::Text(&c.producer)},
                             {"code_bytes_per_token", F::Number(&c.code_bytes_per_token, 0, 1e9)},
                             {"code_kl", F::Number(&c.code_kl, 0, 1e6)},
                             {"layers", F::Integer(&c.layers, 1, 1024)},
                             {"restart_s", F::Number(&c.restart_s, 0, 3600)}}));
          SCD_RETURN_IF_ERROR(NeedName(c.name, where, &names));
          SCD_RETURN_IF_ERROR(
              LoadProfile(where, c.profile, dir, NodeRole::kConsumer, load, &c.costs));
          if (!c.producer.empty() && c.code_bytes_per_token <= 0) {
            return Invalid(absl::StrCat(where, ".code_bytes_per_token: > 0 with a producer"));
          }
          d->consumers.push_back(std::move(c));
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

template <typename Pool>
int IndexOf(const std::vector<Pool>& pools, const std::string& name) {
  for (size_t i = 0; i < pools.size(); ++i) {
    if (pools[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

// A link's trace: loaded, and every step within the simulator's bounds (rates of 1 kbit/s to
// 1 Pbit/s or inf, times within a simulated 30 years, at most 100,000 steps).
absl::Status LoadTrace(const std::string& where, const std::string& dir, const TraceLoader& load,
                       SimLink* l) {
  const std::string full = JoinedPath(l->trace, dir);
  absl::StatusOr<std::vector<TraceStep>> steps =
      load ? load(full) : [&]() -> absl::StatusOr<std::vector<TraceStep>> {
    SCD_ASSIGN_OR_RETURN(const std::string text,
                         ReadBoundedFile(full, kMaxTraceFileBytes, "a bandwidth trace"));
    return ParseBandwidthTrace(text);
  }();
  if (!steps.ok()) return Invalid(absl::StrCat(where, ".trace: ", steps.status().message()));
  if (steps->size() > 100000) return Invalid(absl::StrCat(where, ".trace: over 100000 steps"));
  for (const TraceStep& step : *steps) {
    if (!(step.at_s <= 1e9) || !(step.gbps >= 1e-6) ||
        (step.gbps > 1e6 && !std::isinf(step.gbps))) {
      return Invalid(absl::StrCat(where, ".trace: a step at ", step.at_s, " s of ", step.gbps,
                                  " Gbit/s (times to 1e9 s, rates 1e-6 to 1e6 or inf)"));
    }
  }
  l->steps = std::make_shared<const std::vector<TraceStep>>(*std::move(steps));
  return absl::OkStatus();
}

absl::Status ReadLinks(const toml::node& node, const std::string& dir, const TraceLoader& load,
                       SimDeployment* d) {
  std::set<std::pair<std::string, std::string>> pairs;
  return ForEachTable(node, "link", [&](const toml::table& t, const std::string& where) {
    SimLink l;
    SCD_RETURN_IF_ERROR(ReadTomlTable(t, where,
                                      {{"producer", F::Text(&l.producer)},
                                       {"consumer", F::Text(&l.consumer)},
                                       {"gbps", F::Number(&l.gbps, 0, 1e6)},
                                       {"latency_us", F::Number(&l.latency_us, 0, 1e9)},
                                       {"trace", F::Text(&l.trace)}}));
    if (IndexOf(d->producers, l.producer) < 0) {
      return Invalid(absl::StrCat(where, ".producer: no producer pool '", l.producer, "'"));
    }
    if (IndexOf(d->consumers, l.consumer) < 0) {
      return Invalid(absl::StrCat(where, ".consumer: no consumer pool '", l.consumer, "'"));
    }
    if (!l.trace.empty()) SCD_RETURN_IF_ERROR(LoadTrace(where, dir, load, &l));
    if (l.gbps <= 0 && l.steps == nullptr) {
      return Invalid(absl::StrCat(where, ".gbps: > 0 (or a trace)"));
    }
    if (!pairs.insert({l.producer, l.consumer}).second) {
      return Invalid(absl::StrCat(where, ": a second link of ", l.producer, " -> ", l.consumer));
    }
    d->links.push_back(std::move(l));
    return absl::OkStatus();
  });
}

absl::Status CheckDeployment(const SimDeployment& d) {
  if (d.producers.empty() && d.consumers.empty()) return Invalid("a deployment needs pools");
  if (d.consumers.empty()) return Invalid("a deployment needs a consumer_pool");
  if (d.nodes() > kMaxSimNodes) {
    return Invalid(absl::StrCat(d.nodes(), " nodes in all (at most ", kMaxSimNodes, ")"));
  }
  for (size_t i = 0; i < d.consumers.size(); ++i) {
    const SimConsumerPool& c = d.consumers[i];
    if (!c.producer.empty() && IndexOf(d.producers, c.producer) < 0) {
      return Invalid(
          absl::StrCat("consumer_pool[", i, "].producer: no producer pool '", c.producer, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadLengths(const toml::node& node, const std::string& key, SimLengths* l) {
  std::string kind = "fixed";
  SCD_RETURN_IF_ERROR(ReadSection(node, key,
                                  {{"distribution", F::Text(&kind)},
                                   {"tokens", F::Integer(&l->tokens, 1, kMaxSimTokens)},
                                   {"min", F::Integer(&l->min, 1, kMaxSimTokens)},
                                   {"max", F::Integer(&l->max, 1, kMaxSimTokens)},
                                   {"mean", F::Number(&l->mean, 1, kMaxSimTokens)},
                                   {"sigma", F::Number(&l->sigma, 0, 4)}}));
  if (kind == "fixed") {
    l->kind = SimLengthKind::kFixed;
  } else if (kind == "uniform") {
    l->kind = SimLengthKind::kUniform;
  } else if (kind == "lognormal") {
    l->kind = SimLengthKind::kLogNormal;
  } else {
    return Invalid(absl::StrCat(key, ".distribution: \"fixed\", \"uniform\" or \"lognormal\""));
  }
  if (l->kind != SimLengthKind::kFixed && l->min > l->max) {
    return Invalid(absl::StrCat(key, ": min ", l->min, " above max ", l->max));
  }
  return absl::OkStatus();
}

absl::Status ReadMix(const toml::node& node, SimWorkload* w) {
  return ForEachTable(node, "mix", [&](const toml::table& t, const std::string& where) {
    SimMix m;
    std::string mode = "auto";
    SCD_RETURN_IF_ERROR(ReadTomlTable(t, where,
                                      {{"target", F::Text(&m.target)},
                                       {"mode", F::Text(&mode)},
                                       {"weight", F::Number(&m.weight, 0, 1e9)}}));
    if (m.target.empty()) return Invalid(absl::StrCat(where, ".target: needed"));
    absl::StatusOr<RequestedMode> parsed = ParseRequestedMode(mode);
    if (!parsed.ok() || !(*parsed == RequestedMode::Auto() || *parsed == TransferMode::kLocal ||
                          *parsed == TransferMode::kRaw || *parsed == TransferMode::kScd)) {
      return Invalid(absl::StrCat(where, ".mode: \"auto\", \"local\", \"raw\" or \"scd\""));
    }
    m.mode = *parsed;
    if (m.weight <= 0) return Invalid(absl::StrCat(where, ".weight: > 0"));
    w->mix.push_back(std::move(m));
    return absl::OkStatus();
  });
}

absl::Status ReadFaults(const toml::node& node, SimWorkload* w) {
  return ForEachTable(node, "fault", [&](const toml::table& t, const std::string& where) {
    SimFault f;
    std::string kind = "freeze";
    SCD_RETURN_IF_ERROR(ReadTomlTable(t, where,
                                      {{"kind", F::Text(&kind)},
                                       {"node", F::Text(&f.node)},
                                       {"at_s", F::Number(&f.at_s, 0, 1e6)},
                                       {"hold_s", F::Number(&f.hold_s, 1e-3, 3600)}}));
    if (kind == "kill") {
      f.kind = SimFaultKind::kKill;
    } else if (kind != "freeze") {
      const bool soak =
          kind == "flap" || kind == "etcd" || kind == "replace" || kind == "link-down";
      return Invalid(absl::StrCat(where, ".kind: ",
                                  soak ? absl::StrCat("the soak's '", kind,
                                                      "' is not simulated yet; \"freeze\" and "
                                                      "\"kill\" are")
                                       : "\"freeze\" or \"kill\""));
    }
    if (f.node.empty()) return Invalid(absl::StrCat(where, ".node: needed"));
    w->faults.push_back(std::move(f));
    return absl::OkStatus();
  });
}

absl::Status ReadWorkloadTable(const toml::node& node, SimWorkload* w) {
  std::string arrivals = "poisson";
  int64_t seed = 1;
  SCD_RETURN_IF_ERROR(ReadSection(node, "workload",
                                  {{"duration_s", F::Number(&w->duration_s, 0.001, 1e6)},
                                   {"seed", F::Integer(&seed)},
                                   {"rate", F::Number(&w->rate, 1e-6, 1e6)},
                                   {"arrivals", F::Text(&arrivals)},
                                   {"burstiness", F::Number(&w->burstiness, 0.01, 100)}}));
  w->seed = static_cast<uint64_t>(seed);
  if (arrivals == "poisson") {
    w->arrivals = SimArrivals::kPoisson;
  } else if (arrivals == "gamma") {
    w->arrivals = SimArrivals::kGamma;
  } else if (arrivals == "constant") {
    w->arrivals = SimArrivals::kConstant;
  } else {
    return Invalid("workload.arrivals: \"poisson\", \"gamma\" or \"constant\"");
  }
  return absl::OkStatus();
}

// Each fault's node is one of the deployment's, within the offered window, a freeze shorter than
// the lease, and not overlapping another fault of its node.
absl::Status CheckSimFaults(const SimWorkload& w, const SimDeployment& d) {
  std::map<std::string, FrozenSpans> spans;  // each node's, as the simulator will hold them
  for (size_t i = 0; i < w.faults.size(); ++i) {
    const SimFault& f = w.faults[i];
    const std::string where = absl::StrCat("fault[", i, "]");
    absl::StatusOr<SimNodeRef> found = FindSimNode(d, f.node);
    if (!found.ok()) return Invalid(absl::StrCat(where, ".node: ", found.status().message()));
    if (f.at_s > w.duration_s) {
      return Invalid(
          absl::StrCat(where, ".at_s: ", f.at_s, " is past the workload's ", w.duration_s, " s"));
    }
    if (f.kind == SimFaultKind::kFreeze && f.hold_s >= d.lease_s) {
      return Invalid(absl::StrCat(where, ".hold_s: ", f.hold_s, " s reaches the lease of ",
                                  d.lease_s, " s (its lapse is not simulated)"));
    }
    const absl::Time from = absl::UnixEpoch() + absl::Seconds(f.at_s);
    if (!spans[f.node].Add(from, from + absl::Seconds(SimFaultSpan(d, *found, f))).ok()) {
      return Invalid(absl::StrCat(where, ": overlaps another fault of ", f.node));
    }
  }
  return absl::OkStatus();
}

}  // namespace

double SimFaultSpan(const SimDeployment& deployment, const SimNodeRef& node,
                    const SimFault& fault) {
  if (fault.kind != SimFaultKind::kKill) return fault.hold_s;
  return fault.hold_s + (node.producer ? deployment.producers.at(node.pool).restart_s
                                       : deployment.consumers.at(node.pool).restart_s);
}

SimLink SimDeployment::LinkOf(size_t producer, size_t consumer) const {
  for (const SimLink& l : links) {
    if (l.producer == producers[producer].name && l.consumer == consumers[consumer].name) return l;
  }
  const NodeProfile& p = producers[producer].costs;
  return {producers[producer].name,
          consumers[consumer].name,
          p.link_goodput_gbps,
          p.link_latency_us,
          "",
          nullptr};
}

int64_t SimDeployment::nodes() const {
  int64_t n = coordinators;
  for (const SimProducerPool& p : producers) n += p.count;
  for (const SimConsumerPool& c : consumers) n += c.count;
  return n;
}

absl::StatusOr<SimDeployment> ParseSimDeployment(std::string_view text, const std::string& dir,
                                                 const ProfileLoader& load,
                                                 const TraceLoader& load_trace) {
  SCD_ASSIGN_OR_RETURN(const toml::table root,
                       ParseBoundedToml(text, kMaxSimFileBytes, "a deployment"));
  SimDeployment d;
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (k != "deployment" && k != "producer_pool" && k != "consumer_pool" && k != "link") {
      return Invalid(node.is_table() || node.is_array_of_tables()
                         ? absl::StrCat("unknown table [", k, "]")
                         : absl::StrCat("unknown key ", k));
    }
  }
  if (const toml::node* node = root.get("deployment")) {
    SCD_RETURN_IF_ERROR(ReadSection(*node, "deployment",
                                    {{"name", F::Text(&d.name)},
                                     {"coordinators", F::Integer(&d.coordinators, 1, 1000)},
                                     {"lease_s", F::Number(&d.lease_s, 0.1, 3600)},
                                     {"heartbeat_ms", F::Number(&d.heartbeat_ms, 1, 600000)}}));
  }
  SCD_RETURN_IF_ERROR(ReadPools(root, dir, load, &d));
  if (const toml::node* node = root.get("link")) {
    SCD_RETURN_IF_ERROR(ReadLinks(*node, dir, load_trace, &d));
  }
  SCD_RETURN_IF_ERROR(CheckDeployment(d));
  return d;
}

absl::StatusOr<SimDeployment> ReadSimDeployment(const std::string& path) {
  SCD_ASSIGN_OR_RETURN(const std::string text,
                       ReadBoundedFile(path, kMaxSimFileBytes, "a deployment"));
  absl::StatusOr<SimDeployment> d =
      ParseSimDeployment(text, std::filesystem::path(path).parent_path().string());
  if (!d.ok()) return Invalid(absl::StrCat(path, ": ", d.status().message()));
  return d;
}

std::string SimDeploymentToml(const SimDeployment& d, const std::string& comment) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(comment, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "# ", line, "\n");
  }
  absl::StrAppend(&out, "[deployment]\nname = ", TomlQuoted(d.name),
                  "\ncoordinators = ", d.coordinators, "\nlease_s = ", TomlNumber(d.lease_s),
                  "\nheartbeat_ms = ", TomlNumber(d.heartbeat_ms), "\n");
  for (const SimProducerPool& p : d.producers) {
    absl::StrAppend(&out, "\n[[producer_pool]]\nname = ", TomlQuoted(p.name),
                    "\nprofile = ", TomlQuoted(p.profile), "\ncount = ", p.count,
                    "\nprefix_cache_mb = ", TomlNumber(p.prefix_cache_mb),
                    "\nprefill_threads = ", p.prefill_threads,
                    "\nrestart_s = ", TomlNumber(p.restart_s), "\n");
  }
  for (const SimConsumerPool& c : d.consumers) {
    absl::StrAppend(&out, "\n[[consumer_pool]]\nname = ", TomlQuoted(c.name),
                    "\nprofile = ", TomlQuoted(c.profile), "\ncount = ", c.count,
                    "\nprefix_cache_mb = ", TomlNumber(c.prefix_cache_mb),
                    "\nproducer = ", TomlQuoted(c.producer),
                    "\ncode_bytes_per_token = ", TomlNumber(c.code_bytes_per_token),
                    "\ncode_kl = ", TomlNumber(c.code_kl), "\nlayers = ", c.layers,
                    "\nrestart_s = ", TomlNumber(c.restart_s), "\n");
  }
  for (const SimLink& l : d.links) {
    absl::StrAppend(&out, "\n[[link]]\nproducer = ", TomlQuoted(l.producer),
                    "\nconsumer = ", TomlQuoted(l.consumer), "\ngbps = ", TomlNumber(l.gbps),
                    "\nlatency_us = ", TomlNumber(l.latency_us), "\ntrace = ", TomlQuoted(l.trace),
                    "\n");
  }
  return out;
}

}  // namespace scd::bench

namespace scd::bench {

absl::StatusOr<SimWorkload> ParseSimWorkload(std::string_view text) {
  SCD_ASSIGN_OR_RETURN(const toml::table root,
                       ParseBoundedToml(text, kMaxSimFileBytes, "a workload"));
  SimWorkload w;
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (k == "workload") {
      SCD_RETURN_IF_ERROR(ReadWorkloadTable(node, &w));
    } else if (k == "prompt") {
      SCD_RETURN_IF_ERROR(ReadLengths(node, k, &w.prompt));
    } else if (k == "output") {
      SCD_RETURN_IF_ERROR(ReadLengths(node, k, &w.output));
    } else if (k == "prefix") {
      SCD_RETURN_IF_ERROR(ReadSection(node, k,
                                      {{"groups", F::Integer(&w.prefix_groups, 0, 1 << 24)},
                                       {"share", F::Number(&w.prefix_share, 0, 1)},
                                       {"tenants", F::Integer(&w.tenants, 1, 1 << 16)}}));
    } else if (k == "mix") {
      SCD_RETURN_IF_ERROR(ReadMix(node, &w));
    } else if (k == "fault") {
      SCD_RETURN_IF_ERROR(ReadFaults(node, &w));
    } else if (k == "slo") {
      SCD_RETURN_IF_ERROR(
          ReadSection(node, k,
                      {{"ttft_ms", F::Number(&w.ttft_slo_ms, 0, 1e9)},
                       {"tpot_ms", F::Number(&w.tpot_slo_ms, 0, 1e9)},
                       {"objective_ttft_ms", F::Number(&w.objective_ttft_ms, 0, 1e9)}}));
    } else {
      return Invalid(node.is_table() || node.is_array_of_tables()
                         ? absl::StrCat("unknown table [", k, "]")
                         : absl::StrCat("unknown key ", k));
    }
  }
  if (w.mix.empty()) return Invalid("a workload needs a [[mix]] entry");
  std::stable_sort(w.faults.begin(), w.faults.end(),
                   [](const SimFault& a, const SimFault& b) { return a.at_s < b.at_s; });
  return w;
}

absl::StatusOr<SimWorkload> ReadSimWorkload(const std::string& path) {
  SCD_ASSIGN_OR_RETURN(const std::string text,
                       ReadBoundedFile(path, kMaxSimFileBytes, "a workload"));
  absl::StatusOr<SimWorkload> w = ParseSimWorkload(text);
  if (!w.ok()) return Invalid(absl::StrCat(path, ": ", w.status().message()));
  return w;
}

absl::Status CheckSimWorkload(const SimWorkload& workload, const SimDeployment& deployment) {
  for (size_t i = 0; i < workload.mix.size(); ++i) {
    const SimMix& m = workload.mix[i];
    const int pool = IndexOf(deployment.consumers, m.target);
    if (pool < 0) {
      return Invalid(absl::StrCat("mix[", i, "].target: no consumer pool '", m.target, "'"));
    }
    const bool codes = m.mode == TransferMode::kRaw || m.mode == TransferMode::kScd;
    if (codes && deployment.consumers[static_cast<size_t>(pool)].producer.empty()) {
      return Invalid(absl::StrCat("mix[", i, "]: ", RequestedModeName(m.mode), " to '", m.target,
                                  "', which has no producer"));
    }
  }
  return CheckSimFaults(workload, deployment);
}

absl::StatusOr<SimNodeRef> FindSimNode(const SimDeployment& deployment, const std::string& node) {
  const size_t dash = node.rfind('-');
  int64_t index = -1;
  if (dash != std::string::npos && absl::SimpleAtoi(node.substr(dash + 1), &index) && index >= 0) {
    const std::string pool = node.substr(0, dash);
    for (size_t p = 0; p < deployment.producers.size(); ++p) {
      if (deployment.producers[p].name == pool && index < deployment.producers[p].count) {
        return SimNodeRef{true, p, index};
      }
    }
    for (size_t c = 0; c < deployment.consumers.size(); ++c) {
      if (deployment.consumers[c].name == pool && index < deployment.consumers[c].count) {
        return SimNodeRef{false, c, index};
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("no node '", node, "' in ", deployment.name,
                                          " (its nodes: POOL-I, I from 0 to the pool's count)"));
}

bool MeetsSlo(const SimWorkload& w, double ttft_s, double tpot_s) {
  return (w.ttft_slo_ms <= 0 || ttft_s * 1e3 <= w.ttft_slo_ms) &&
         (w.tpot_slo_ms <= 0 || tpot_s * 1e3 <= w.tpot_slo_ms);
}

}  // namespace scd::bench
