#include "bench/node_profile.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bounded_toml.h"

namespace scd::bench {

namespace {

using Tables = std::map<std::string, TomlFields>;

Tables FieldsOf(NodeProfile* p, std::string* role) {
  using F = TomlField;
  Tables f;
  f["node"] = {{"role", F::Text(role)},
               {"model", F::Text(&p->model)},
               {"machine", F::Text(&p->machine)},
               {"cpu_quota", F::Number(&p->cpu_quota)}};
  f["prefill"] = {{"fixed_us", F::Number(&p->prefill.fixed_us)},
                  {"per_token_us", F::Number(&p->prefill.per_token_us)},
                  {"per_token_context_us", F::Number(&p->prefill.per_token_context_us)}};
  for (auto [name, cost] : std::initializer_list<std::pair<const char*, LineCost*>>{
           {"encode", &p->encode}, {"rebuild", &p->rebuild}, {"first_decode", &p->first_decode}}) {
    f[name] = {{"fixed_us", F::Number(&cost->fixed_us)},
               {"per_token_us", F::Number(&cost->per_token_us)}};
  }
  f["decode_step"] = {{"fixed_us", F::Number(&p->decode_step.fixed_us)},
                      {"per_sequence_us", F::Number(&p->decode_step.per_sequence_us)},
                      {"per_context_token_us", F::Number(&p->decode_step.per_context_token_us)}};
  f["interference"] = {{"local_itl_us", F::Number(&p->local_itl_us)},
                       {"rebuild_itl_us", F::Number(&p->rebuild_itl_us)},
                       {"busy_prefill_us", F::Number(&p->busy_prefill_us)}};
  f["api"] = {{"overhead_us", F::Number(&p->api_overhead_us)}};
  f["idle"] = {{"after_us", F::Number(&p->idle.after_us)},
               {"slowdown_p50", F::Number(&p->idle.slowdown_p50, 1)},
               {"slowdown_p90", F::Number(&p->idle.slowdown_p90, 1)},
               {"api_overhead_us", F::Number(&p->idle.api_overhead_us)}};
  f["step_noise"] = {{"p10", F::Number(&p->step_noise.p10)},
                     {"p50", F::Number(&p->step_noise.p50)},
                     {"p90", F::Number(&p->step_noise.p90)},
                     {"p99", F::Number(&p->step_noise.p99)}};
  f["memory"] = {{"kv_bytes_per_token", F::Integer(&p->kv_bytes_per_token)},
                 {"kv_budget_bytes", F::Integer(&p->kv_budget_bytes)},
                 {"capacity", F::Integer(&p->capacity)},
                 {"step_rows", F::Integer(&p->step_rows)}};
  f["link"] = {{"goodput_gbps", F::Number(&p->link_goodput_gbps)},
               {"latency_us", F::Number(&p->link_latency_us)}};
  return f;
}

absl::Status ReadTables(const toml::table& root, const Tables& tables) {
  for (const auto& [table_key, table_node] : root) {
    const std::string table_name(table_key.str());
    const auto known = tables.find(table_name);
    if (known == tables.end()) {
      return absl::InvalidArgumentError(table_node.is_table()
                                            ? absl::StrCat("unknown table [", table_name, "]")
                                            : absl::StrCat("unknown key ", table_name));
    }
    absl::StatusOr<const toml::table*> table = TomlTableAt(table_node, table_name);
    if (!table.ok()) return table.status();
    if (absl::Status read = ReadTomlTable(**table, table_name, known->second); !read.ok()) {
      return read;
    }
  }
  return absl::OkStatus();
}

absl::Status Missing(const char* what, NodeRole role) {
  return absl::InvalidArgumentError(
      absl::StrCat("a ", NodeRoleName(role), " profile needs ", what));
}

}  // namespace

const char* NodeRoleName(NodeRole role) {
  return role == NodeRole::kProducer ? "producer" : "consumer";
}

double PrefillCost::At(int64_t tokens, int64_t cached) const {
  const double n = static_cast<double>(tokens);
  const double c = static_cast<double>(cached);
  return fixed_us + per_token_us * n + per_token_context_us * (n * c + n * (n + 1) / 2);
}

double IdleCost::Share(double idle_us) const {
  if (after_us <= 0 || idle_us <= 0) return 0;
  return std::min(1.0, idle_us / after_us);
}

double IdleCost::Factor(double idle_us, double z) const {
  const double share = Share(idle_us);
  if (share <= 0) return 1;
  // z at the 90th percentile of a standard normal.
  constexpr double kZ90 = 1.2815515655446004;
  const double sigma = std::log(slowdown_p90 / slowdown_p50) / kZ90;
  const double slowdown = slowdown_p50 * std::exp(sigma * z);
  return std::max(1.0, 1 + share * (slowdown - 1));
}

double StepNoise::Factor(double u) const {
  if (!measured()) return 1;
  struct Knot {
    double u, q;
  };
  const Knot knots[] = {{0, p10}, {0.1, p10}, {0.5, p50}, {0.9, p90}, {0.99, p99}, {1, p99}};
  double mean = 0, at = p99;
  for (size_t i = 1; i < std::size(knots); ++i) {
    const Knot &a = knots[i - 1], &b = knots[i];
    mean += (b.u - a.u) * (a.q + b.q) / 2;
    if (u >= a.u && u < b.u) at = a.q + (b.q - a.q) * (u - a.u) / (b.u - a.u);
  }
  return at / mean;
}

double NodeProfile::LinkUs(int64_t bytes) const {
  if (link_goodput_gbps <= 0) return link_latency_us;
  return link_latency_us + static_cast<double>(bytes) * 8.0 / (link_goodput_gbps * 1e3);
}

absl::Status CheckNodeProfile(const NodeProfile& p) {
  NodeProfile copy = p;
  std::string role = NodeRoleName(p.role);
  for (const auto& [table, keys] : FieldsOf(&copy, &role)) {
    for (const auto& [key, field] : keys) {
      const std::string name = absl::StrCat(table, ".", key);
      if (field.number != nullptr && !(std::isfinite(*field.number) && *field.number >= field.min &&
                                       *field.number <= field.max)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", *field.number));
      }
      if (field.integer != nullptr &&
          (*field.integer < field.integer_min || *field.integer > field.integer_max)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", *field.integer));
      }
      if (field.text != nullptr &&
          (field.text->size() > kMaxTomlString ||
           std::any_of(field.text->begin(), field.text->end(),
                       [](unsigned char c) { return c < 0x20 || c == 0x7f; }))) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": not printable text"));
      }
    }
  }
  if (p.model.empty()) return Missing("node.model", p.role);
  const StepNoise& n = p.step_noise;
  if ((n.p10 > 0 || n.p50 > 0 || n.p90 > 0 || n.p99 > 0) &&
      !(n.p10 > 0 && n.p10 <= n.p50 && n.p50 <= n.p90 && n.p90 <= n.p99)) {
    return Missing("step_noise 0 < p10 <= p50 <= p90 <= p99 (or none)", p.role);
  }
  if (p.idle.slowdown_p90 < p.idle.slowdown_p50) {
    return Missing("idle.slowdown_p90 at least idle.slowdown_p50", p.role);
  }
  // A pass costs more the more tokens it runs: by its per-token term or its context term (a fit
  // of noisy passes may carry the growth in either).
  if (p.prefill.per_token_us + p.prefill.per_token_context_us <= 0) {
    return Missing("prefill.per_token_us or per_token_context_us > 0", p.role);
  }
  if (p.role == NodeRole::kProducer) {
    if (p.link_goodput_gbps <= 0) return Missing("link.goodput_gbps > 0", p.role);
    return absl::OkStatus();
  }
  // A step of one sequence over one position costs something (a fit may carry it in any term).
  if (p.decode_step.At(1, 1) <= 0) return Missing("a decode_step cost > 0", p.role);
  if (p.kv_bytes_per_token <= 0) return Missing("memory.kv_bytes_per_token > 0", p.role);
  if (p.kv_budget_bytes < p.kv_bytes_per_token) {
    return Missing("memory.kv_budget_bytes of one token at least", p.role);
  }
  if (p.capacity <= 0) return Missing("memory.capacity > 0", p.role);
  if (p.step_rows <= 0) return Missing("memory.step_rows > 0", p.role);
  return absl::OkStatus();
}

absl::StatusOr<NodeProfile> ParseNodeProfile(std::string_view toml_text) {
  absl::StatusOr<toml::table> root = ParseBoundedToml(toml_text, kMaxProfileBytes, "a profile");
  if (!root.ok()) return root.status();
  NodeProfile profile;
  std::string role;
  if (absl::Status read = ReadTables(*root, FieldsOf(&profile, &role)); !read.ok()) return read;
  if (role == "producer") {
    profile.role = NodeRole::kProducer;
  } else if (role == "consumer") {
    profile.role = NodeRole::kConsumer;
  } else {
    return absl::InvalidArgumentError("node.role: \"producer\" or \"consumer\"");
  }
  if (absl::Status checked = CheckNodeProfile(profile); !checked.ok()) return checked;
  return profile;
}

absl::StatusOr<NodeProfile> ReadNodeProfile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxProfileBytes, "a profile");
  if (!text.ok()) return text.status();
  absl::StatusOr<NodeProfile> profile = ParseNodeProfile(*text);
  if (!profile.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", profile.status().message()));
  }
  return profile;
}

std::string NodeProfileToml(const NodeProfile& p) {
  std::string out = absl::StrCat(
      "# One node type's measured costs (bench/node_profile.h), microseconds.\n[node]\nrole = ",
      TomlQuoted(NodeRoleName(p.role)), "\nmodel = ", TomlQuoted(p.model),
      "\nmachine = ", TomlQuoted(p.machine), "\ncpu_quota = ", TomlNumber(p.cpu_quota), "\n\n");
  absl::StrAppend(&out,
                  "[prefill]  # fixed + per_token * n + per_token_context * (n * cached + "
                  "n * (n + 1) / 2)\nfixed_us = ",
                  TomlNumber(p.prefill.fixed_us),
                  "\nper_token_us = ", TomlNumber(p.prefill.per_token_us),
                  "\nper_token_context_us = ", TomlNumber(p.prefill.per_token_context_us), "\n\n");
  auto line = [&out](const char* name, const char* form, const LineCost& cost) {
    absl::StrAppend(&out, "[", name, "]  # ", form, "\nfixed_us = ", TomlNumber(cost.fixed_us),
                    "\nper_token_us = ", TomlNumber(cost.per_token_us), "\n\n");
  };
  if (p.idle.after_us > 0) {
    absl::StrAppend(&out,
                    "[idle]  # the first work after after_us of nothing: its time over its busy "
                    "cost\nafter_us = ",
                    TomlNumber(p.idle.after_us),
                    "\nslowdown_p50 = ", TomlNumber(p.idle.slowdown_p50),
                    "\nslowdown_p90 = ", TomlNumber(p.idle.slowdown_p90));
    if (p.role == NodeRole::kConsumer) {
      absl::StrAppend(&out, "\napi_overhead_us = ", TomlNumber(p.idle.api_overhead_us));
    }
    absl::StrAppend(&out, "\n\n");
  }
  if (p.role == NodeRole::kProducer) {
    line("encode", "codes of n tokens: fixed + per_token * n", p.encode);
    absl::StrAppend(&out, "[link]\ngoodput_gbps = ", TomlNumber(p.link_goodput_gbps),
                    "\nlatency_us = ", TomlNumber(p.link_latency_us), "\n");
    return out;
  }
  line("rebuild", "n tokens' cache from codes: fixed + per_token * n", p.rebuild);
  line("first_decode", "the first step after a transfer of n prompt tokens", p.first_decode);
  absl::StrAppend(
      &out,
      "[decode_step]  # fixed + per_sequence * sequences + per_context_token * their context\n",
      "fixed_us = ", TomlNumber(p.decode_step.fixed_us),
      "\nper_sequence_us = ", TomlNumber(p.decode_step.per_sequence_us),
      "\nper_context_token_us = ", TomlNumber(p.decode_step.per_context_token_us), "\n\n");
  absl::StrAppend(&out,
                  "[interference]  # per prompt token\nlocal_itl_us = ", TomlNumber(p.local_itl_us),
                  "\nrebuild_itl_us = ", TomlNumber(p.rebuild_itl_us),
                  "\nbusy_prefill_us = ", TomlNumber(p.busy_prefill_us), "\n\n");
  absl::StrAppend(&out,
                  "[api]  # a client's TTFT beyond the consumer's own: coordinator, hops back\n"
                  "overhead_us = ",
                  TomlNumber(p.api_overhead_us), "\n\n");
  if (p.step_noise.measured()) {
    absl::StrAppend(&out, "[step_noise]  # a step's time over its shape's mean, quantiles\np10 = ",
                    TomlNumber(p.step_noise.p10), "\np50 = ", TomlNumber(p.step_noise.p50),
                    "\np90 = ", TomlNumber(p.step_noise.p90),
                    "\np99 = ", TomlNumber(p.step_noise.p99), "\n\n");
  }
  absl::StrAppend(&out, "[memory]\nkv_bytes_per_token = ", p.kv_bytes_per_token,
                  "\nkv_budget_bytes = ", p.kv_budget_bytes, "\ncapacity = ", p.capacity,
                  "\nstep_rows = ", p.step_rows, "\n");
  return out;
}

}  // namespace scd::bench
