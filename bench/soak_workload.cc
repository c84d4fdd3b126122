#include "bench/soak_workload.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"

namespace scd::bench {

absl::StatusOr<std::vector<std::string>> SoakPrompts(const std::string& file, int groups,
                                                     int per_group) {
  absl::StatusOr<std::string> text = ReadFileToString(file);
  if (!text.ok()) return text.status();
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    lines.emplace_back(absl::StripAsciiWhitespace(line));
  }
  constexpr int kPrefixLines = 3;
  const size_t needed = static_cast<size_t>(groups) * (kPrefixLines + per_group);
  if (groups < 1 || per_group < 1 || lines.size() < needed) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", lines.size(), " lines; ", groups,
                                                   " groups of ", per_group, " prompts need ",
                                                   needed));
  }
  std::vector<std::string> prompts;
  size_t next = 0;
  for (int g = 0; g < groups; ++g) {
    std::vector<std::string> prefix(
        lines.begin() + static_cast<std::ptrdiff_t>(next),
        lines.begin() + static_cast<std::ptrdiff_t>(next) + kPrefixLines);
    next += kPrefixLines;
    const std::string shared = absl::StrJoin(prefix, " ");
    for (int p = 0; p < per_group; ++p) prompts.push_back(shared + " " + lines[next++]);
  }
  return prompts;
}

const char* ClientActionName(ClientAction action) {
  switch (action) {
    case ClientAction::kNone:
      return "none";
    case ClientAction::kCancel:
      return "cancel";
    case ClientAction::kAbandon:
      return "abandon";
  }
  return "?";
}

SoakRequestSpec DrawSoakRequest(const SoakMix& mix, int prompts, uint64_t seed, int64_t index) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(index));
  std::uniform_real_distribution<double> u(0, 1);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  SoakRequestSpec s;
  s.index = index;
  s.request_id = absl::StrCat("soak-", seed, "-", index);
  s.prompt = static_cast<int>(pick(static_cast<size_t>(prompts)));
  s.salt = mix.salts[pick(mix.salts.size())];
  if (mix.targets.size() > 1 && u(rng) < mix.fanout) {
    s.targets = mix.targets;
    s.mode = u(rng) < 0.5 ? "scd" : "auto";  // one prefill, codes to every target
  } else {
    s.targets = {mix.targets[pick(mix.targets.size())]};
    static const char* kModes[] = {"local", "raw", "scd", "scd", "auto", "auto"};
    s.mode = kModes[pick(6)];
  }
  s.greedy = u(rng) >= mix.sampled;
  s.seed = rng();
  s.forbid_fallback = s.mode != "local" && u(rng) < mix.forbid_fallback;
  s.max_tokens = static_cast<uint32_t>(mix.min_tokens + static_cast<int>(pick(static_cast<size_t>(
                                                            mix.max_tokens - mix.min_tokens + 1))));
  s.deadline_ms = mix.deadline_ms;
  const double action = u(rng);
  if (action < mix.cancel) {
    s.action = ClientAction::kCancel;
    s.action_after = absl::Milliseconds(static_cast<int64_t>(u(rng) * 300));
  } else if (action < mix.cancel + mix.abandon) {
    s.action = ClientAction::kAbandon;
    s.action_after = absl::Milliseconds(static_cast<int64_t>(u(rng) * 200));
  } else if (action < mix.cancel + mix.abandon + mix.short_deadline) {
    s.short_deadline = true;
    s.deadline_ms = 50 + static_cast<uint32_t>(u(rng) * 350);
  } else if (action < mix.cancel + mix.abandon + mix.short_deadline + mix.slow_read) {
    s.read_pace = mix.min_read_pace + (mix.max_read_pace - mix.min_read_pace) * u(rng);
  }
  return s;
}

v1::GenerateRequest ToGenerateRequest(const SoakRequestSpec& spec,
                                      const std::vector<std::string>& prompts) {
  v1::GenerateRequest r;
  r.set_prompt(prompts.at(static_cast<size_t>(spec.prompt)));
  for (const std::string& t : spec.targets) r.add_targets(t);
  SetRequestModeName(spec.mode, &r);
  r.set_cache_salt(spec.salt);
  r.set_max_tokens(spec.max_tokens);
  if (!spec.greedy) {
    r.set_temperature(0.8f);
    r.set_top_p(0.9f);
    r.set_seed(spec.seed);
  }
  if (spec.forbid_fallback) r.set_allow_local_fallback(false);
  r.set_deadline_ms(spec.deadline_ms);
  r.set_request_id(spec.request_id);
  return r;
}

absl::StatusOr<SoakReferences> SoakReferences::Compute(
    const std::string& server, const std::vector<std::string>& prompts,
    const std::vector<std::string>& targets, const std::vector<std::string>& modes,
    uint32_t max_tokens, const std::function<void(int, int)>& on_progress) {
  SoakReferences out;
  const int total = static_cast<int>(prompts.size() * targets.size() * modes.size());
  int done = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (const std::string& target : targets) {
      for (const std::string& mode : modes) {
        v1::GenerateRequest request;
        request.set_prompt(prompts[p]);
        request.add_targets(target);
        SetRequestModeName(mode, &request);
        request.set_max_tokens(max_tokens);
        request.set_logprobs(2);
        SoakReference ref;
        std::string error;
        const absl::Status status =
            StreamGenerate(server, request, absl::Seconds(60), [&](const v1::GenerateEvent& e) {
              if (e.has_token()) {
                for (int32_t id : e.token().ids()) ref.ids.push_back(id);
                for (const v1::TokenLogprobs& lp : e.token().logprobs()) {
                  ref.gaps.push_back(lp.top_size() >= 2 ? lp.top(0).logprob() - lp.top(1).logprob()
                                                        : std::numeric_limits<double>::infinity());
                }
              } else if (e.has_finished()) {
                ref.reason = e.finished().reason();
                ref.mode = RanModeName(e.finished());
              } else if (e.has_error()) {
                error = e.error().message();
              }
            });
        if (!status.ok() || !error.empty() || ref.reason.empty() ||
            ref.gaps.size() != ref.ids.size()) {
          return absl::InternalError(
              absl::StrCat("the reference for prompt ", p, ", ", target, ", ", mode, " failed: ",
                           status.ok() ? (error.empty() ? "no Finished or logprobs" : error)
                                       : std::string(status.message())));
        }
        if (ref.mode != mode) {
          return absl::InternalError(absl::StrCat("the reference for ", target, " in mode ", mode,
                                                  " was served in mode ", ref.mode));
        }
        out.refs_[{static_cast<int>(p), target, mode}] = std::move(ref);
        if (on_progress) on_progress(++done, total);
      }
    }
  }
  return out;
}

const SoakReference* SoakReferences::Find(int prompt, const std::string& target,
                                          const std::string& mode) const {
  auto it = refs_.find({prompt, target, mode});
  return it == refs_.end() ? nullptr : &it->second;
}

TokenVerdict CompareWithReference(const std::vector<int32_t>& served, const std::string& reason,
                                  const SoakReference& reference, double tie) {
  TokenVerdict v;
  const size_t n = std::min(served.size(), reference.ids.size());
  for (size_t i = 0; i < n; ++i) {
    if (served[i] == reference.ids[i]) continue;
    v.parted_at = static_cast<int>(i);
    v.near_tie = reference.gaps[i] <= tie;
    v.ok = v.near_tie;
    if (!v.ok) {
      v.why =
          absl::StrCat("token ", i, " is ", served[i], ", the reference's ", reference.ids[i],
                       " (its top-two gap ", reference.gaps[i], " > the near-tie bound ", tie, ")");
    }
    return v;
  }
  // Agreeing as far as both go: the served stream may end sooner (its max_tokens), never at an
  // EOS the reference does not have, and never run past the reference's EOS.
  if (served.size() > reference.ids.size() && reference.reason == "stop") {
    v.ok = false;
    v.why = absl::StrCat(served.size(), " tokens; the reference stopped (EOS) after ",
                         reference.ids.size());
  } else if (reason == "stop" && served.size() < reference.ids.size()) {
    v.ok = false;
    v.why = absl::StrCat("stopped after ", served.size(), " tokens; the reference went on to ",
                         reference.ids.size());
  }
  return v;
}

absl::StatusOr<double> NearTieBound(const std::string& model_dir) {
  absl::StatusOr<std::string> text = ReadFileToString(model_dir + "/config.json");
  if (!text.ok()) return text.status();
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto number = [&](const char* key) {
    return config.is_object() && config.contains(key) && config[key].is_number();
  };
  if (!number("hidden_size") || !number("intermediate_size") || !number("num_hidden_layers")) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, "/config.json: no hidden_size, intermediate_size or layers"));
  }
  const double width =
      std::max(config["hidden_size"].get<double>(), config["intermediate_size"].get<double>());
  // ModelConfig::NearTieBound's at float32 (this library links no model runtime).
  return 50 * static_cast<double>(std::numeric_limits<float>::epsilon()) * width *
         config["num_hidden_layers"].get<double>();
}

}  // namespace scd::bench
