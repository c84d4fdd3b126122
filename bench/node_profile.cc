#include "bench/node_profile.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"

namespace scd::bench {

namespace {

constexpr size_t kMaxStringBytes = 256;
constexpr int64_t kMaxProfileInteger = int64_t{1} << 53;

// Where one key of the file lands in the profile.
struct Field {
  double* number = nullptr;
  int64_t* integer = nullptr;
  std::string* text = nullptr;
};
using Fields = std::map<std::string, std::map<std::string, Field>>;

Fields FieldsOf(NodeProfile* p, std::string* role) {
  Fields f;
  f["node"] = {{"role", {nullptr, nullptr, role}},
               {"model", {nullptr, nullptr, &p->model}},
               {"machine", {nullptr, nullptr, &p->machine}},
               {"cpu_quota", {&p->cpu_quota}}};
  f["prefill"] = {{"fixed_us", {&p->prefill.fixed_us}},
                  {"per_token_us", {&p->prefill.per_token_us}},
                  {"per_token_context_us", {&p->prefill.per_token_context_us}}};
  for (auto [name, cost] : std::initializer_list<std::pair<const char*, LineCost*>>{
           {"encode", &p->encode}, {"rebuild", &p->rebuild}, {"first_decode", &p->first_decode}}) {
    f[name] = {{"fixed_us", {&cost->fixed_us}}, {"per_token_us", {&cost->per_token_us}}};
  }
  f["decode_step"] = {{"fixed_us", {&p->decode_step.fixed_us}},
                      {"per_sequence_us", {&p->decode_step.per_sequence_us}},
                      {"per_context_token_us", {&p->decode_step.per_context_token_us}}};
  f["interference"] = {{"local_itl_us", {&p->local_itl_us}},
                       {"rebuild_itl_us", {&p->rebuild_itl_us}},
                       {"busy_prefill_us", {&p->busy_prefill_us}}};
  f["memory"] = {{"kv_bytes_per_token", {nullptr, &p->kv_bytes_per_token}},
                 {"kv_budget_bytes", {nullptr, &p->kv_budget_bytes}},
                 {"capacity", {nullptr, &p->capacity}},
                 {"step_rows", {nullptr, &p->step_rows}}};
  f["link"] = {{"goodput_gbps", {&p->link_goodput_gbps}}, {"latency_us", {&p->link_latency_us}}};
  return f;
}

absl::Status ReadField(const std::string& name, const toml::node& node, const Field& field) {
  if (field.text != nullptr) {
    const std::optional<std::string> text = node.value_exact<std::string>();
    if (!text.has_value()) return absl::InvalidArgumentError(absl::StrCat(name, ": not a string"));
    if (text->size() > kMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": over ", kMaxStringBytes, " bytes"));
    }
    for (unsigned char c : *text) {
      if (c < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": a control character"));
      }
    }
    *field.text = *text;
    return absl::OkStatus();
  }
  if (field.integer != nullptr) {
    const std::optional<int64_t> v = node.value_exact<int64_t>();
    if (!v.has_value() || *v < 0 || *v > kMaxProfileInteger) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not an integer from 0 to ", kMaxProfileInteger));
    }
    *field.integer = *v;
    return absl::OkStatus();
  }
  std::optional<double> v;
  if (node.is_integer()) v = static_cast<double>(*node.value_exact<int64_t>());
  if (node.is_floating_point()) v = node.value_exact<double>();
  if (!v.has_value() || !std::isfinite(*v) || *v < 0 || *v > kMaxProfileValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a finite number from 0 to ", kMaxProfileValue));
  }
  *field.number = *v;
  return absl::OkStatus();
}

absl::Status ReadTables(const toml::table& root, const Fields& fields) {
  for (const auto& [table_key, table_node] : root) {
    const std::string table_name(table_key.str());
    const auto known = fields.find(table_name);
    if (known == fields.end()) {
      return absl::InvalidArgumentError(table_node.is_table()
                                            ? absl::StrCat("unknown table [", table_name, "]")
                                            : absl::StrCat("unknown key ", table_name));
    }
    const toml::table* table = table_node.as_table();
    if (table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(table_name, " is not a table"));
    }
    for (const auto& [key, node] : *table) {
      const std::string name = absl::StrCat(table_name, ".", std::string(key.str()));
      const auto field = known->second.find(std::string(key.str()));
      if (field == known->second.end()) {
        return absl::InvalidArgumentError(absl::StrCat("unknown key ", name));
      }
      if (absl::Status read = ReadField(name, node, field->second); !read.ok()) return read;
    }
  }
  return absl::OkStatus();
}

absl::Status Missing(const char* what, NodeRole role) {
  return absl::InvalidArgumentError(
      absl::StrCat("a ", NodeRoleName(role), " profile needs ", what));
}

// A number as TOML reads it back exactly: 17 significant digits, a float's form kept.
std::string Number(double v) {
  std::string text = absl::StrFormat("%.17g", v);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// A basic TOML string of printable text (CheckNodeProfile refused control characters).
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
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
      if (field.number != nullptr && !(std::isfinite(*field.number) && *field.number >= 0 &&
                                       *field.number <= kMaxProfileValue)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", *field.number));
      }
      if (field.integer != nullptr && (*field.integer < 0 || *field.integer > kMaxProfileInteger)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", *field.integer));
      }
      if (field.text != nullptr &&
          (field.text->size() > kMaxStringBytes ||
           std::any_of(field.text->begin(), field.text->end(),
                       [](unsigned char c) { return c < 0x20 || c == 0x7f; }))) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": not printable text"));
      }
    }
  }
  if (p.model.empty()) return Missing("node.model", p.role);
  if (p.prefill.per_token_us <= 0) return Missing("prefill.per_token_us > 0", p.role);
  if (p.role == NodeRole::kProducer) {
    if (p.link_goodput_gbps <= 0) return Missing("link.goodput_gbps > 0", p.role);
    return absl::OkStatus();
  }
  if (p.decode_step.fixed_us + p.decode_step.per_sequence_us <= 0) {
    return Missing("a decode_step cost > 0", p.role);
  }
  if (p.kv_bytes_per_token <= 0) return Missing("memory.kv_bytes_per_token > 0", p.role);
  if (p.kv_budget_bytes < p.kv_bytes_per_token) {
    return Missing("memory.kv_budget_bytes of one token at least", p.role);
  }
  if (p.capacity <= 0) return Missing("memory.capacity > 0", p.role);
  if (p.step_rows <= 0) return Missing("memory.step_rows > 0", p.role);
  return absl::OkStatus();
}

absl::StatusOr<NodeProfile> ParseNodeProfile(std::string_view toml_text) {
  if (toml_text.size() > kMaxProfileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a profile of ", toml_text.size(), " bytes (at most ", kMaxProfileBytes, ")"));
  }
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& error) {
    const toml::source_position where = error.source().begin;
    return absl::InvalidArgumentError(absl::StrCat("line ", where.line, ", column ", where.column,
                                                   ": ", std::string(error.description())));
  }
  NodeProfile profile;
  std::string role;
  if (absl::Status read = ReadTables(root, FieldsOf(&profile, &role)); !read.ok()) return read;
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
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > kMaxProfileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, a profile has at most ", kMaxProfileBytes));
  }
  absl::StatusOr<std::string> text = ReadFileToString(path);
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
      Quoted(NodeRoleName(p.role)), "\nmodel = ", Quoted(p.model),
      "\nmachine = ", Quoted(p.machine), "\ncpu_quota = ", Number(p.cpu_quota), "\n\n");
  absl::StrAppend(&out,
                  "[prefill]  # fixed + per_token * n + per_token_context * (n * cached + "
                  "n * (n + 1) / 2)\nfixed_us = ",
                  Number(p.prefill.fixed_us), "\nper_token_us = ", Number(p.prefill.per_token_us),
                  "\nper_token_context_us = ", Number(p.prefill.per_token_context_us), "\n\n");
  auto line = [&out](const char* name, const char* form, const LineCost& cost) {
    absl::StrAppend(&out, "[", name, "]  # ", form, "\nfixed_us = ", Number(cost.fixed_us),
                    "\nper_token_us = ", Number(cost.per_token_us), "\n\n");
  };
  if (p.role == NodeRole::kProducer) {
    line("encode", "codes of n tokens: fixed + per_token * n", p.encode);
    absl::StrAppend(&out, "[link]\ngoodput_gbps = ", Number(p.link_goodput_gbps),
                    "\nlatency_us = ", Number(p.link_latency_us), "\n");
    return out;
  }
  line("rebuild", "n tokens' cache from codes: fixed + per_token * n", p.rebuild);
  line("first_decode", "the first step after a transfer of n prompt tokens", p.first_decode);
  absl::StrAppend(
      &out,
      "[decode_step]  # fixed + per_sequence * sequences + per_context_token * their context\n",
      "fixed_us = ", Number(p.decode_step.fixed_us),
      "\nper_sequence_us = ", Number(p.decode_step.per_sequence_us),
      "\nper_context_token_us = ", Number(p.decode_step.per_context_token_us), "\n\n");
  absl::StrAppend(&out,
                  "[interference]  # per prompt token\nlocal_itl_us = ", Number(p.local_itl_us),
                  "\nrebuild_itl_us = ", Number(p.rebuild_itl_us),
                  "\nbusy_prefill_us = ", Number(p.busy_prefill_us), "\n\n");
  absl::StrAppend(&out, "[memory]\nkv_bytes_per_token = ", p.kv_bytes_per_token,
                  "\nkv_budget_bytes = ", p.kv_budget_bytes, "\ncapacity = ", p.capacity,
                  "\nstep_rows = ", p.step_rows, "\n");
  return out;
}

}  // namespace scd::bench
