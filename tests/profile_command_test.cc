// `scd-bench profile` (bench/profile_command.h) on real daemons under CPU quotas: a producer and
// a consumer of the stories260k pair (a real artifact fitted here by scd-calib), each in a cgroup
// of its own. What the profile says is checked against what the nodes say of themselves: the
// positions the producer counted computing (its NodeStats) are the ones the fit's prefill samples
// say it computed, the quota groups ran the nodes and are gone afterwards, and the profiles are
// valid and read back. Needs root and cgroup v1's cpu controller; skipped with the reason
// elsewhere.
#include "bench/profile_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "base/cpu_quota.h"
#include "bench/node_profile.h"
#include "bench/quick_artifact.h"
#include "tests/test_files.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

TEST(ProfileCommandTest, RealDaemonsUnderQuotasGiveProfilesTheirOwnCountsAgreeWith) {
  {
    absl::StatusOr<std::unique_ptr<CpuQuotaGroups>> groups = CpuQuotaGroups::Create();
    if (!groups.ok()) GTEST_SKIP() << groups.status();
  }
  const std::string dir = fs::temp_directory_path() / ("scd-profile-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bin = testing::BuildDir() + "/bin";
  absl::StatusOr<std::string> artifact =
      FitQuickArtifact(bin, testing::SharedDir(), testing::ModelDir("stories260k"),
                       testing::ModelDir("stories260k-fables"), dir + "/pair.scd");
  ASSERT_TRUE(artifact.ok()) << artifact.status();

  ProfileOptions o;
  o.producer_model = testing::ModelDir("stories260k");
  o.consumer_model = testing::ModelDir("stories260k-fables");
  o.artifact = *artifact;
  o.out = dir + "/profile";
  o.bin_dir = bin;
  o.prompt_lens = {8, 16, 32, 64, 96};
  o.batches = {1, 2, 4};
  o.output_len = 16;
  o.repeats = 2;
  o.runs = 2;
  o.idle_gap_ms = 150;  // a stories260k request takes a few ms: the rest of the 150 is idle
  o.progress = false;
  absl::StatusOr<ProfileReport> r = RunProfile(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->fit.ok()) << r->fit.status();

  // 5 lengths x 2 groups x 3 prompts, in each mode; a step per batch size and prompt length; two
  // runs of each. The fits are to the shapes' medians: 9 step shapes.
  EXPECT_EQ(r->runs, 2);
  size_t busy = 0, idle = 0;
  for (const PromptSample& s : r->input.prompts) (s.idle_us > 0 ? idle : busy) += 1;
  EXPECT_EQ(busy, 120u);
  // After idle: each length twice in each mode, the first of each phase not counted (it followed
  // the busy phase at once), nor one that found the one before still running.
  EXPECT_GT(idle, 0u);
  EXPECT_LE(idle, 2u * 2 * 9);
  // 9 step samples a run, each 16 output tokens' later half (7 gaps) per stream: the noise.
  EXPECT_GE(r->input.step_ratios.size(), 2u * 9 * 7);
  EXPECT_TRUE(r->fit->consumer.step_noise.measured());
  for (const NodeProfile* p : {&r->fit->consumer, &r->fit->producer}) {
    EXPECT_GT(p->idle.after_us, 0);
    EXPECT_LT(p->idle.after_us, 150000);
    EXPECT_GE(p->idle.slowdown_p90, p->idle.slowdown_p50);
    EXPECT_GE(p->idle.slowdown_p50, 1);
  }
  EXPECT_EQ(r->input.steps.size(), 18u);
  for (const FitReport& f : r->fit->fits) {
    if (f.cost == "consumer.decode_step") {
      EXPECT_EQ(f.samples, 9);
    }
  }
  // A client's TTFT through the coordinator is longer than the consumer's own.
  EXPECT_GT(r->fit->consumer.api_overhead_us, 0);
  // The producer's own count of the positions its passes computed is what the samples (prompt
  // less its last token, less what its prefix cache held) say: the fit's n is the pass's n.
  EXPECT_GT(r->producer_sample_tokens, 0);
  EXPECT_EQ(r->producer_counted_tokens, r->producer_sample_tokens);
  int cached = 0;
  for (const PromptSample& s : r->input.prompts)
    cached += s.producer_cached > 0 || s.consumer_cached > 0;
  EXPECT_GT(cached, 0);  // the groups' later prompts hit the prefix caches
  // Both nodes ran in their quota groups (the kernel counted their periods).
  ASSERT_EQ(r->throttling.size(), 2u);
  for (const auto& [node, t] : r->throttling) {
    EXPECT_GT(t.periods, 0) << node;
    EXPECT_LE(t.throttled, t.periods) << node;
  }
  EXPECT_FALSE(fs::exists(std::string(kCgroupCpuMount) + "/scd/" + std::to_string(getpid())));
  // Valid profiles of their roles, read back the same.
  for (const NodeProfile& p : {r->fit->producer, r->fit->consumer}) {
    absl::StatusOr<NodeProfile> back = ParseNodeProfile(NodeProfileToml(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(NodeProfileToml(*back), NodeProfileToml(p));
    EXPECT_EQ(p.cpu_quota, 0.5);
  }
  EXPECT_EQ(r->fit->consumer.capacity, 16);  // the deployment's consumers' --capacity
  // 5 layers, K and V of 4 heads of 8, float32.
  EXPECT_EQ(r->fit->consumer.kv_bytes_per_token, 2 * 5 * 4 * 8 * 4);
  EXPECT_EQ(r->fit->fits.size(), 7u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace scd::bench
