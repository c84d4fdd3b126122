// `scd-bench ucx-kills`: the rounds (bench/ucx_kill_stress.h). Each round starts two peers from
// scd-bench itself, waits until both flow, faults one, and reads how the other ended.
#include "bench/ucx_kill_stress.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "base/file_util.h"
#include "base/progress.h"
#include "base/timer.h"

namespace scd::bench {
namespace {

// The peer's RESULT line in its log, or "".
std::string ResultLine(const std::string& log) {
  std::string line;
  for (absl::string_view l : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(l, "RESULT ")) line = std::string(l);
  }
  return line;
}

std::string LogOf(const ChildProcess& child) {
  absl::StatusOr<std::string> text = ReadFileToString(child.log());
  return text.ok() ? *text : "";
}

struct RoundFiles {
  std::string addr_a, addr_b, flow_a, flow_b, log_a, log_b;
  // The files a round's peers wait on (a stale one from an earlier run in the same folder would
  // send a peer to a port nobody listens on).
  void RemoveSignals() const {
    for (const std::string* f : {&addr_a, &addr_b, &flow_a, &flow_b}) std::filesystem::remove(*f);
  }
};

RoundFiles FilesOf(const std::string& dir, int round) {
  const std::string p = absl::StrCat(dir, "/round-", round, "-");
  return {p + "a.addr", p + "b.addr", p + "a.flowing", p + "b.flowing", p + "a.log", p + "b.log"};
}

absl::StatusOr<ChildProcess> StartPeer(const UcxKillOptions& o, const std::string& own,
                                       const std::string& peer, const std::string& flowing,
                                       const std::string& log) {
  return ChildProcess::Start(
      {o.peer_binary, "ucx-kills-peer", "--address-file", own, "--peer-file", peer,
       "--flowing-file", flowing, "--chunk-bytes", std::to_string(o.chunk_bytes)},
      log, UcxPeerEnv(o.config, o.tls), /*stdout_to_log=*/true);
}

// How `child` ended once it exited (or `within` passed: then SIGKILLed, kHung).
PeerEnd EndOf(ChildProcess& child, absl::Duration within, std::string* how, std::string* detail) {
  const int status = child.Wait(within);
  *how = child.HowItEnded();
  const std::string log = LogOf(child);
  const PeerEnd end = ClassifyPeerEnd(status, *how, log);
  *detail = end == PeerEnd::kAborted ? AbortLine(log) : ResultLine(log);
  return end;
}

// One round: both peers up and flowing, then the fault and the ends.
UcxKillRound RunRound(const UcxKillOptions& o, int round, std::mt19937_64& rng) {
  UcxKillRound r;
  r.round = round;
  r.close = round % 2 == 1;
  r.victim = (round / 2) % 2 == 0 ? 'a' : 'b';
  const RoundFiles f = FilesOf(o.out, round);
  f.RemoveSignals();
  absl::StatusOr<ChildProcess> a = StartPeer(o, f.addr_a, f.addr_b, f.flow_a, f.log_a);
  absl::StatusOr<ChildProcess> b = StartPeer(o, f.addr_b, f.addr_a, f.flow_b, f.log_b);
  if (!a.ok() || !b.ok()) {
    r.detail = (!a.ok() ? a.status() : b.status()).ToString();
    return r;
  }
  for (auto [child, file] : {std::pair{&*a, f.flow_a}, std::pair{&*b, f.flow_b}}) {
    absl::StatusOr<std::string> flowing = child->WaitForFile(file, absl::Seconds(30));
    if (!flowing.ok()) {
      r.detail = flowing.status().ToString();
      return r;  // both SIGKILLed as they go out of scope
    }
  }
  r.flowed = true;
  std::uniform_real_distribution<double> delay(0, absl::ToDoubleMilliseconds(o.max_delay));
  r.delay_ms = delay(rng);
  absl::SleepFor(absl::Milliseconds(r.delay_ms));  // paces: where in the transfer the fault lands
  ChildProcess& victim = r.victim == 'a' ? *a : *b;
  ChildProcess& survivor = r.victim == 'a' ? *b : *a;
  const absl::Time fault = absl::Now();
  victim.Signal(r.close ? SIGTERM : SIGKILL);
  r.survivor = EndOf(survivor, o.end_within, &r.survivor_end, &r.detail);
  r.ended_ms = absl::ToDoubleMilliseconds(absl::Now() - fault);
  if (r.close) {
    std::string how, detail;
    r.closer = EndOf(victim, o.end_within, &how, &detail);
    if (r.closer != PeerEnd::kClean && r.survivor == PeerEnd::kClean) {
      r.detail = absl::StrCat("closer ", how, ": ", detail);
    }
  } else {
    victim.Wait(absl::Seconds(5));
  }
  return r;
}

bool Aborted(const UcxKillRound& r) {
  return r.survivor == PeerEnd::kAborted || r.closer == PeerEnd::kAborted;
}

}  // namespace

const char* UcxConfigName(UcxConfig config) {
  return config == UcxConfig::kBackend ? "backend" : "ucx-defaults";
}

std::vector<std::string> UcxPeerEnv(UcxConfig config, const std::string& tls) {
  std::vector<std::string> env = {"UCX_TLS=" + tls};
  if (config == UcxConfig::kUcxDefaults) {
    // UCX 1.13's own values (ucx_info -c), which transport/ucx/ucx_config.cc overrides unless set.
    for (const char* v : {"UCX_TCP_PUT_ENABLE=y", "UCX_ZCOPY_THRESH=auto",
                          "UCX_TCP_TX_SEG_SIZE=8kb", "UCX_TCP_RX_SEG_SIZE=64kb"}) {
      env.push_back(v);
    }
  }
  return env;
}

const char* PeerEndName(PeerEnd end) {
  switch (end) {
    case PeerEnd::kClean:
      return "clean";
    case PeerEnd::kAborted:
      return "aborted";
    case PeerEnd::kHung:
      return "hung";
    case PeerEnd::kFailed:
      return "failed";
  }
  return "?";
}

PeerEnd ClassifyPeerEnd(int exit_status, const std::string& how_it_ended, const std::string& log) {
  if (absl::StartsWith(how_it_ended, "still running")) return PeerEnd::kHung;
  if (absl::StartsWith(how_it_ended, "killed by signal")) return PeerEnd::kAborted;
  const std::string result = ResultLine(log);
  const bool ended_well =
      absl::StartsWith(result, "RESULT lost ") || absl::StartsWith(result, "RESULT closed ");
  return exit_status == 0 && ended_well ? PeerEnd::kClean : PeerEnd::kFailed;
}

std::string AbortLine(const std::string& log) {
  for (absl::string_view l : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(l, "Assertion") || absl::StrContains(l, "Fatal") ||
        absl::StrContains(l, "fatal")) {
      return std::string(absl::StripAsciiWhitespace(l));
    }
  }
  return "";
}

int UcxKillReport::aborts() const {
  return static_cast<int>(std::count_if(rounds.begin(), rounds.end(), Aborted));
}

int UcxKillReport::hangs() const {
  return static_cast<int>(std::count_if(rounds.begin(), rounds.end(), [](const UcxKillRound& r) {
    return r.survivor == PeerEnd::kHung || r.closer == PeerEnd::kHung;
  }));
}

int UcxKillReport::failed() const {
  return static_cast<int>(std::count_if(rounds.begin(), rounds.end(), [](const UcxKillRound& r) {
    return !r.flowed || r.survivor == PeerEnd::kFailed || r.closer == PeerEnd::kFailed;
  }));
}

absl::StatusOr<UcxKillReport> RunUcxKills(const UcxKillOptions& o) {
  if (o.peer_binary.empty() || o.out.empty()) {
    return absl::InvalidArgumentError("ucx-kills: needs the peer binary and an output folder");
  }
  std::filesystem::create_directories(o.out);
  UcxKillReport report;
  report.options = o;
  std::mt19937_64 rng(o.seed);
  Progress bar("ucx-kills", o.rounds, o.progress);
  for (int i = 0; i < o.rounds; ++i) {
    report.rounds.push_back(RunRound(o, i, rng));
    const UcxKillRound& r = report.rounds.back();
    const RoundFiles files = FilesOf(o.out, i);
    files.RemoveSignals();
    if (r.survivor == PeerEnd::kClean && r.closer == PeerEnd::kClean) {
      for (const std::string* log : {&files.log_a, &files.log_b}) {
        std::filesystem::remove(*log);  // kept only where something went wrong
      }
    }
    bar.Advance();
    bar.SetDetail(absl::StrCat(report.aborts(), " aborted, ", report.hangs(), " hung, ",
                               report.failed(), " failed"));
    if (o.stop_after_aborts > 0 && report.aborts() >= o.stop_after_aborts) break;
  }
  bar.Done();
  return report;
}

std::string UcxKillJson(const UcxKillReport& report) {
  using Json = nlohmann::json;
  const UcxKillOptions& o = report.options;
  Json rounds = Json::array();
  for (const UcxKillRound& r : report.rounds) {
    rounds.push_back({{"round", r.round},
                      {"fault", r.close ? "close" : "kill"},
                      {"victim", std::string(1, r.victim)},
                      {"delay_ms", r.delay_ms},
                      {"flowed", r.flowed},
                      {"survivor", PeerEndName(r.survivor)},
                      {"survivor_end", r.survivor_end},
                      {"closer", PeerEndName(r.closer)},
                      {"ended_ms", r.ended_ms},
                      {"detail", r.detail}});
  }
  return Json{{"config", UcxConfigName(o.config)},
              {"env", UcxPeerEnv(o.config, o.tls)},
              {"chunk_bytes", o.chunk_bytes},
              {"rounds_run", report.rounds.size()},
              {"aborts", report.aborts()},
              {"hangs", report.hangs()},
              {"failed", report.failed()},
              {"pass", report.pass()},
              {"rounds", rounds}}
      .dump(1);
}

std::string UcxKillSummary(const UcxKillReport& report) {
  const UcxKillOptions& o = report.options;
  int kills = 0, closes = 0;
  std::vector<double> ended;
  for (const UcxKillRound& r : report.rounds) {
    if (!r.flowed) continue;
    (r.close ? closes : kills) += 1;
    if (r.survivor == PeerEnd::kClean) ended.push_back(r.ended_ms);
  }
  const int n = static_cast<int>(report.rounds.size());
  std::string out = absl::StrFormat(
      "ucx-kills (%s: %s), %d rounds (%d kills, %d closes), %zu MiB chunks both ways:\n"
      "  aborted %d (%.1f %%), hung %d, failed %d\n",
      UcxConfigName(o.config), absl::StrJoin(UcxPeerEnv(o.config, o.tls), " "), n, kills, closes,
      o.chunk_bytes >> 20, report.aborts(), n > 0 ? 100.0 * report.aborts() / n : 0.0,
      report.hangs(), report.failed());
  if (!ended.empty()) {
    absl::StrAppendFormat(&out, "  survivor ended after the fault: p50 %.0f ms, p99 %.0f ms\n",
                          Percentile(ended, 0.5), Percentile(ended, 0.99));
  }
  int shown = 0;
  for (const UcxKillRound& r : report.rounds) {
    if ((r.survivor == PeerEnd::kClean && r.closer == PeerEnd::kClean && r.flowed) || ++shown > 5) {
      continue;
    }
    absl::StrAppendFormat(&out, "  round %d (%s of %c after %.0f ms): %s, %s %s\n", r.round,
                          r.close ? "close" : "kill", r.victim, r.delay_ms, PeerEndName(r.survivor),
                          r.survivor_end, r.detail);
  }
  absl::StrAppendFormat(&out, "verdict: %s\n", report.pass() ? "PASS" : "FAIL");
  return out;
}

}  // namespace scd::bench
