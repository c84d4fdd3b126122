// `scd-bench ucx-kills` (bench/ucx_kill_stress.h): how a round's processes are judged, from real
// endings (an exit after the peer's loss, UCX's assertion and the abort it ends in, a hang), and
// four real rounds under the backend's configuration -- each fault kind on each side -- where the
// survivor must see its peer lost and exit by itself.
#include "bench/ucx_kill_stress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_daemon.h"

namespace scd::bench {
namespace {

// What Debian's libuct 1.13 printed before the abort the stress reproduces (a survivor's log).
constexpr char kUcxAbortLog[] =
    "[1733072400.123456] [host:4242 :1]        tcp_ep.c:939  Assertion `ep->flags & "
    "UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK' failed\n"
    "==== backtrace (tid:   4242) ====\n";

TEST(UcxKillStressTest, APeersEndIsJudgedByHowItExitedAndWhatItSaid) {
  EXPECT_EQ(ClassifyPeerEnd(0, "exited with status 0",
                            "LISTENING\nRESULT lost sent_mib=64 received_mib=48 first_end=\"x\"\n"),
            PeerEnd::kClean);
  EXPECT_EQ(ClassifyPeerEnd(0, "exited with status 0", "RESULT closed sent_mib=16\n"),
            PeerEnd::kClean);
  EXPECT_EQ(ClassifyPeerEnd(-1, "killed by signal 6 (Aborted)", kUcxAbortLog), PeerEnd::kAborted);
  EXPECT_EQ(ClassifyPeerEnd(-1, "still running after the timeout (SIGKILLed)", ""), PeerEnd::kHung);
  EXPECT_EQ(ClassifyPeerEnd(1, "exited with status 1", "RESULT setup_failed UNAVAILABLE\n"),
            PeerEnd::kFailed);
  EXPECT_EQ(ClassifyPeerEnd(0, "exited with status 0", "no result line\n"), PeerEnd::kFailed);
  EXPECT_EQ(AbortLine(kUcxAbortLog),
            "[1733072400.123456] [host:4242 :1]        tcp_ep.c:939  Assertion `ep->flags & "
            "UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK' failed");
  EXPECT_EQ(AbortLine("RESULT lost\n"), "");
}

TEST(UcxKillStressTest, UcxsOwnDefaultsAreForcedOnlyForTheMeasurement) {
  EXPECT_EQ(UcxPeerEnv(UcxConfig::kBackend, "tcp"), std::vector<std::string>{"UCX_TLS=tcp"});
  const std::vector<std::string> defaults = UcxPeerEnv(UcxConfig::kUcxDefaults, "tcp");
  EXPECT_EQ(defaults.front(), "UCX_TLS=tcp");
  EXPECT_NE(std::find(defaults.begin(), defaults.end(), "UCX_TCP_PUT_ENABLE=y"), defaults.end());
}

TEST(UcxKillStressTest, ASurvivorOfAKilledOrClosingPeerEndsByItself) {
  UcxKillOptions o;
  o.rounds = 4;  // kill a, close a, kill b, close b
  o.chunk_bytes = size_t{16} << 20;
  o.max_delay = absl::Milliseconds(100);
  o.peer_binary = testing::Bin("scd-bench");
  o.out = ::testing::TempDir() + "/ucx_kills";
  // A stale address file from an earlier run in the same folder must not send a peer astray.
  std::filesystem::create_directories(o.out);
  std::ofstream(o.out + "/round-0-b.addr") << "127.0.0.1:1\n";
  absl::StatusOr<UcxKillReport> report = RunUcxKills(o);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rounds.size(), 4u);
  for (const UcxKillRound& r : report->rounds) {
    SCOPED_TRACE(r.round);
    EXPECT_TRUE(r.flowed) << r.detail;
    EXPECT_EQ(r.survivor, PeerEnd::kClean) << r.survivor_end << ": " << r.detail;
    EXPECT_EQ(r.closer, PeerEnd::kClean) << r.detail;
    if (r.survivor == PeerEnd::kClean) {
      EXPECT_NE(r.detail.find("RESULT lost"), std::string::npos) << r.detail;
    }
  }
  EXPECT_EQ(report->rounds[0].victim, 'a');
  EXPECT_FALSE(report->rounds[0].close);
  EXPECT_TRUE(report->rounds[1].close);
  EXPECT_EQ(report->rounds[2].victim, 'b');
  EXPECT_TRUE(report->pass()) << UcxKillSummary(*report);
}

}  // namespace
}  // namespace scd::bench
