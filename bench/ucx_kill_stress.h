// `scd-bench ucx-kills`: can a UCX peer's death take the survivor down? Two processes stream
// 16 MiB chunks to each other over the UCX backend on tcp (a transfer session each way, several
// chunks in flight both ways: rendezvous sends under way in both directions), and at a random
// point mid-transfer one of them is killed (SIGKILL) or closes every link at once (SIGTERM: its
// links closed with FORCE, its transport torn down, then it exits). The survivor must see its
// peer lost and end by itself; it must not abort, crash or hang.
//
// UCX 1.13's tcp transport aborts a process when its peer goes away while a PUT's ack or a
// zero-copy send is outstanding (tcp_ep.c:939 `PUT_TX_WAITING_ACK`, uct_iface.h:884
// `comp->count > 0`; Debian's libuct has its assertions on). transport/ucx/ucx_config.cc keeps
// tcp off PUT and zero-copy. `config = kUcxDefaults` puts UCX's own settings back through the
// environment (the user's UCX_* win over the backend's), to measure the abort rate that change
// removed; kBackend runs the backend as shipped.
//
// Each round: peers A and B (this binary's hidden `ucx-kills-peer`, RunUcxKillPeer) listen,
// connect to each other and stream; once both have sent and received a chunk (a "flowing" file)
// the harness waits a random 0..max_delay and faults the victim (kill and close alternate; A and
// B take turns). A round's outcome is the survivor's end, and for a close the closer's too.
// Thread-safety: RunUcxKills from the main thread (children get SIGTERM when it dies).
#ifndef SCD_BENCH_UCX_KILL_STRESS_H_
#define SCD_BENCH_UCX_KILL_STRESS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace scd::bench {

enum class UcxConfig { kBackend, kUcxDefaults };
// "backend" / "ucx-defaults".
const char* UcxConfigName(UcxConfig config);
// The environment a peer runs with under `config` (UCX_TLS=`tls`, and for kUcxDefaults UCX 1.13's
// own tcp settings: PUT on, zero-copy from its automatic threshold, 8 KiB / 64 KiB segments).
std::vector<std::string> UcxPeerEnv(UcxConfig config, const std::string& tls);

struct UcxKillOptions {
  int rounds = 100;
  int stop_after_aborts = 0;  // stop once this many rounds aborted (0: run every round)
  UcxConfig config = UcxConfig::kBackend;
  std::string tls = "tcp";
  size_t chunk_bytes = size_t{16} << 20;
  absl::Duration max_delay = absl::Milliseconds(300);  // after both flow, before the fault
  // How long the survivor (and a closer) may take to end after the fault.
  absl::Duration end_within = absl::Seconds(15);
  uint64_t seed = 1;
  std::string peer_binary;  // scd-bench (started as `PEER ucx-kills-peer ...`)
  std::string out;          // each round's peer logs (round-N-a.log, round-N-b.log)
  bool progress = false;
};

// How a process that was not SIGKILLed by the harness ended.
enum class PeerEnd {
  kClean,    // exited 0 after its peer was lost (or, for a closer, after closing)
  kAborted,  // killed by a signal of its own (SIGABRT from an assertion, SIGSEGV)
  kHung,     // still running `end_within` after the fault (then SIGKILLed)
  kFailed,   // exited non-zero: it never flowed, or did not see its peer lost
};
const char* PeerEndName(PeerEnd end);
// From ChildProcess's exit status and HowItEnded, and the peer's log (its RESULT line).
PeerEnd ClassifyPeerEnd(int exit_status, const std::string& how_it_ended, const std::string& log);
// The line of `log` that says why a process aborted (UCX's assertion or fatal line), else "".
std::string AbortLine(const std::string& log);

struct UcxKillRound {
  int round = 0;
  bool close = false;  // the victim closed its links (SIGTERM), else SIGKILL
  char victim = 'a';
  double delay_ms = 0;  // after both flowed, before the fault
  bool flowed = false;  // both peers sent and received a chunk (else no fault)
  PeerEnd survivor = PeerEnd::kFailed;
  std::string survivor_end;          // HowItEnded
  std::string detail;                // the abort's line, or the survivor's RESULT line
  PeerEnd closer = PeerEnd::kClean;  // a close round's victim
  double ended_ms = 0;               // fault to the survivor's exit
};

struct UcxKillReport {
  UcxKillOptions options;
  std::vector<UcxKillRound> rounds;
  int aborts() const;  // rounds where a process other than the SIGKILLed one died by a signal
  int hangs() const;
  int failed() const;  // never flowed, or ended without seeing its peer lost
  // 0 aborts, hangs and failures.
  bool pass() const { return aborts() == 0 && hangs() == 0 && failed() == 0; }
};

absl::StatusOr<UcxKillReport> RunUcxKills(const UcxKillOptions& options);
std::string UcxKillJson(const UcxKillReport& report);
std::string UcxKillSummary(const UcxKillReport& report);

// The peer process (`scd-bench ucx-kills-peer`): listens, writes its address to `address_file`,
// waits for `peer_file`, streams chunk_bytes chunks to that address while it receives the peer's,
// writes `flowing_file` once both flow. It ends at its peer's loss (prints "RESULT lost ...",
// exit 0) or at SIGTERM (closes every link at once, prints "RESULT closed ...", exit 0); exit 1
// when it cannot set up. Call first in main, before any thread starts.
struct UcxKillPeerOptions {
  std::string address_file;
  std::string peer_file;
  std::string flowing_file;
  size_t chunk_bytes = size_t{16} << 20;
};
int RunUcxKillPeer(const UcxKillPeerOptions& options);

}  // namespace scd::bench

#endif  // SCD_BENCH_UCX_KILL_STRESS_H_
