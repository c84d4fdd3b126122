// The cluster simulator's deployment and workload files (bench/sim_config.h): the committed
// examples read with their real profiles, every field where the file put it, a pool's link from
// its [[link]] or its producer's profile, and every bound and reference refused naming it.
#include "bench/sim_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"

namespace scd::bench {
namespace {

using ::testing::HasSubstr;

std::string Example(const std::string& name) {
  return std::string(SCD_SOURCE_DIR) + "/bench/cluster/" + name;
}

TEST(SimConfigTest, TheExamplesReadWithTheirProfiles) {
  absl::StatusOr<SimDeployment> d = ReadSimDeployment(Example("example_deployment.toml"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name, "base-and-fables");
  EXPECT_EQ(d->coordinators, 2);
  ASSERT_EQ(d->producers.size(), 1u);
  ASSERT_EQ(d->consumers.size(), 1u);
  EXPECT_EQ(d->producers[0].count, 2);
  EXPECT_EQ(d->producers[0].costs.model, "tinystories-4m");
  EXPECT_EQ(d->consumers[0].costs.role, NodeRole::kConsumer);
  EXPECT_EQ(d->consumers[0].producer, "tinystories-4m");
  EXPECT_EQ(d->consumers[0].code_bytes_per_token, 384);
  EXPECT_EQ(d->consumers[0].layers, 6);
  EXPECT_EQ(d->nodes(), 2 + 2 + 6);
  const SimLink link = d->LinkOf(0, 0);
  EXPECT_EQ(link.gbps, 1.0);
  EXPECT_EQ(link.latency_us, 200);

  absl::StatusOr<SimWorkload> w = ReadSimWorkload(Example("example_workload.toml"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->rate, 20);
  EXPECT_EQ(w->prompt.kind, SimLengthKind::kLogNormal);
  EXPECT_EQ(w->prompt.max, 400);
  EXPECT_EQ(w->output.kind, SimLengthKind::kUniform);
  EXPECT_EQ(w->prefix_groups, 16);
  EXPECT_EQ(w->tenants, 4);
  ASSERT_EQ(w->mix.size(), 2u);
  EXPECT_EQ(w->mix[0].mode, RequestedMode::Auto());
  EXPECT_EQ(w->mix[1].mode, RequestedMode(TransferMode::kLocal));
  EXPECT_EQ(w->ttft_slo_ms, 500);
  EXPECT_TRUE(CheckSimWorkload(*w, *d).ok());
}

// Every deployment and workload committed beside the examples (the scale check's, the plan's
// traffic and cases, the validation's, auto's load bar's) reads, and its workloads fit the
// deployments they go with.
TEST(SimConfigTest, EveryCommittedDeploymentAndWorkloadReads) {
  namespace fs = std::filesystem;
  int deployments = 0, workloads = 0;
  absl::StatusOr<SimDeployment> example = ReadSimDeployment(Example("example_deployment.toml"));
  ASSERT_TRUE(example.ok()) << example.status();
  for (const char* dir : {"plan", "scale", "validation", "auto_bar"}) {
    for (const fs::directory_entry& e : fs::directory_iterator(Example(dir))) {
      if (e.path().extension() != ".toml") continue;
      const std::string name = e.path().filename().string();
      if (name.rfind("nodes-", 0) == 0 || name == "emulated.toml") {
        absl::StatusOr<SimDeployment> d = ReadSimDeployment(e.path().string());
        EXPECT_TRUE(d.ok()) << d.status();
        ++deployments;
        continue;
      }
      absl::StatusOr<SimWorkload> w = ReadSimWorkload(e.path().string());
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_TRUE(CheckSimWorkload(*w, *example).ok()) << name;
      ++workloads;
    }
  }
  EXPECT_EQ(deployments, 4);  // nodes-100, -300, -1000, the validation twin
  EXPECT_GE(workloads, 15);   // 5 plan, 1 scale, 6 validation, 3 auto's bar
}

// Profiles by name, so the deployment tests need no files.
ProfileLoader Profiles() {
  return [](const std::string& path) -> absl::StatusOr<NodeProfile> {
    NodeProfile p;
    p.model = "m";
    p.prefill = {10, 1, 0};
    if (path.find("producer") != std::string::npos) {
      p.role = NodeRole::kProducer;
      p.link_goodput_gbps = 3;
      p.link_latency_us = 40;
      return p;
    }
    if (path.find("consumer") == std::string::npos) return absl::NotFoundError(path);
    p.decode_step = {100, 10, 0};
    p.kv_bytes_per_token = 100;
    p.kv_budget_bytes = 1 << 20;
    p.capacity = 8;
    p.step_rows = 256;
    return p;
  };
}

constexpr char kDeployment[] = R"([deployment]
coordinators = 1
[[producer_pool]]
name = "base"
profile = "producer.toml"
count = 3
[[consumer_pool]]
name = "a"
profile = "consumer.toml"
count = 4
producer = "base"
code_bytes_per_token = 100
[[consumer_pool]]
name = "b"
profile = "consumer.toml"
)";

TEST(SimConfigTest, PathsAreRelativeToTheFileAndAPairWithoutALinkUsesTheProducersMeasuredOne) {
  std::vector<std::string> asked;
  ProfileLoader load = [&asked](const std::string& path) {
    asked.push_back(path);
    return Profiles()(path);
  };
  absl::StatusOr<SimDeployment> d = ParseSimDeployment(kDeployment, "/some/dir", load);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(asked, (std::vector<std::string>{"/some/dir/producer.toml", "/some/dir/consumer.toml",
                                             "/some/dir/consumer.toml"}));
  const SimLink link = d->LinkOf(0, 0);
  EXPECT_EQ(link.gbps, 3);
  EXPECT_EQ(link.latency_us, 40);
  EXPECT_EQ(d->nodes(), 1 + 3 + 4 + 1);
  EXPECT_TRUE(d->consumers[1].producer.empty());
}

// What `scd-bench plan` writes: a deployment read back from its text is the same deployment,
// fractions to the last digit and names with quotes in them included; the comment stays a comment.
TEST(SimConfigTest, ADeploymentWrittenReadsBackTheSame) {
  absl::StatusOr<SimDeployment> d = ParseSimDeployment(kDeployment, "/some/dir", Profiles());
  ASSERT_TRUE(d.ok()) << d.status();
  d->name = "say \"cheap\"";
  d->lease_s = 0.1 + 0.2;  // not a short decimal
  d->producers[0].prefix_cache_mb = 1.0 / 3;
  d->producers[0].prefill_threads = 3;
  d->consumers[0].code_kl = 0.0528;
  d->consumers[0].layers = 22;
  d->links.push_back({"base", "a", 2.5, 1e3 / 7, "drop.trace", nullptr});
  const std::string text = SimDeploymentToml(*d, "made by a test\nsecond line");
  std::vector<std::string> traces;
  const TraceLoader trace = [&traces](const std::string& path) {
    traces.push_back(path);
    return absl::StatusOr<std::vector<TraceStep>>(std::vector<TraceStep>{{0, 1}, {2, 0.5}});
  };
  EXPECT_EQ(text.rfind("# made by a test\n# second line\n[deployment]\n", 0), 0u) << text;
  absl::StatusOr<SimDeployment> back = ParseSimDeployment(text, "/some/dir", Profiles(), trace);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(back->name, d->name);
  EXPECT_EQ(back->coordinators, d->coordinators);
  EXPECT_EQ(back->lease_s, d->lease_s);
  EXPECT_EQ(back->heartbeat_ms, d->heartbeat_ms);
  ASSERT_EQ(back->producers.size(), 1u);
  EXPECT_EQ(back->producers[0].count, 3);
  EXPECT_EQ(back->producers[0].prefix_cache_mb, 1.0 / 3);
  EXPECT_EQ(back->producers[0].prefill_threads, 3);
  EXPECT_EQ(back->producers[0].profile, "producer.toml");
  ASSERT_EQ(back->consumers.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->consumers[i].name, d->consumers[i].name);
    EXPECT_EQ(back->consumers[i].count, d->consumers[i].count);
    EXPECT_EQ(back->consumers[i].producer, d->consumers[i].producer);
    EXPECT_EQ(back->consumers[i].code_bytes_per_token, d->consumers[i].code_bytes_per_token);
    EXPECT_EQ(back->consumers[i].code_kl, d->consumers[i].code_kl);
    EXPECT_EQ(back->consumers[i].layers, d->consumers[i].layers);
  }
  ASSERT_EQ(back->links.size(), 1u);
  EXPECT_EQ(back->links[0].gbps, 2.5);
  EXPECT_EQ(back->links[0].latency_us, 1e3 / 7);
  EXPECT_EQ(back->links[0].trace, "drop.trace");
  EXPECT_EQ(traces, std::vector<std::string>{"/some/dir/drop.trace"});  // beside the file
  ASSERT_NE(back->links[0].steps, nullptr);
  EXPECT_EQ(back->links[0].steps->size(), 2u);
  EXPECT_EQ(SimDeploymentToml(*back, "made by a test\nsecond line"), text);
}

TEST(SimConfigTest, ALinksTraceIsReadBesideTheFileBoundedAndRefusedNamingTheLink) {
  const std::string dir = testing::TempDir() + "/scd-sim-trace";
  std::filesystem::create_directories(dir);
  const std::string link = "[[link]]\nproducer = \"base\"\nconsumer = \"a\"\ntrace = \"t.trace\"\n";
  auto parse = [&](const std::string& trace_text) {
    std::ofstream(dir + "/t.trace") << trace_text;
    return ParseSimDeployment(std::string(kDeployment) + link, dir, Profiles());
  };
  absl::StatusOr<SimDeployment> d = parse("0 1\n5 0.01  # the link drops\n");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(d->LinkOf(0, 0).steps, nullptr);  // no gbps needed with a trace
  EXPECT_EQ(d->LinkOf(0, 0).steps->at(1).gbps, 0.01);
  EXPECT_THAT(parse("0 1\n0 2\n").status().message(), HasSubstr("link[0].trace: "));
  EXPECT_THAT(parse("0 1e-9\n").status().message(), HasSubstr("link[0].trace: a step"));
  EXPECT_THAT(parse(std::string(kMaxTraceFileBytes + 1, '#')).status().message(),
              HasSubstr("link[0].trace"));
  std::filesystem::remove(dir + "/t.trace");
  EXPECT_THAT(parse("").status().message(), HasSubstr("link[0].trace"));  // written empty
  std::filesystem::remove_all(dir);
}

TEST(SimConfigTest, RefusesWhatIsWrongNamingIt) {
  struct Case {
    std::string text, says;
  };
  auto edited = [](const std::string& from, const std::string& to) {
    return absl::StrReplaceAll(kDeployment, {{from, to}});
  };
  const std::vector<Case> cases = {
      {edited("count = 3", "cuont = 3"), "unknown key producer_pool[0].cuont"},
      {edited("count = 3", "count = 0"), "producer_pool[0].count"},
      {edited("count = 4", "count = 100001"), "consumer_pool[0].count"},
      {edited("count = 3", "count = 60000\n") + "count = 50000\n", "nodes in all"},
      {edited("[deployment]", "[deploymnet]"), "unknown table [deploymnet]"},
      {edited("name = \"b\"", "name = \"a\""), "'a' twice"},
      {edited("producer = \"base\"", "producer = \"bsae\""), "no producer pool 'bsae'"},
      {edited("code_bytes_per_token = 100", ""), "code_bytes_per_token"},
      {edited("profile = \"producer.toml\"", "profile = \"consumer.toml\""), "not a producer's"},
      {edited("profile = \"producer.toml\"", "profile = \"nothing.toml\""),
       "producer_pool[0].profile"},
      {edited("coordinators = 1", "coordinators = 1.5"), "deployment.coordinators"},
      {edited("code_bytes_per_token = 100", "code_bytes_per_token = 100\nlayers = 0"),
       "consumer_pool[0].layers"},
      {std::string(kDeployment) + "[[link]]\nproducer = \"base\"\nconsumer = \"c\"\ngbps = 1\n",
       "no consumer pool 'c'"},
      {std::string(kDeployment) + "[[link]]\nproducer = \"base\"\nconsumer = \"a\"\ngbps = 0\n",
       "link[0].gbps"},
      {std::string(kDeployment) + "[[link]]\nproducer = \"base\"\nconsumer = \"a\"\ngbps = 1\n" +
           "[[link]]\nproducer = \"base\"\nconsumer = \"a\"\ngbps = 2\n",
       "a second link"},
      {"[deployment]\n", "pools"},
      {std::string(kMaxSimFileBytes + 1, '#'), "at most"},
      {"[deployment\n", "line 1"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SimDeployment> d = ParseSimDeployment(c.text, "", Profiles());
    ASSERT_FALSE(d.ok()) << c.says;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr(c.says)) << d.status();
  }
}

TEST(SimConfigTest, RefusesAWorkloadThatIsWrongNamingIt) {
  const std::string good = "[workload]\nrate = 5\n[[mix]]\ntarget = \"a\"\nmode = \"scd\"\n";
  ASSERT_TRUE(ParseSimWorkload(good).ok());
  struct Case {
    std::string text, says;
  };
  const std::vector<Case> cases = {
      {"[workload]\nrate = 0\n[[mix]]\ntarget = \"a\"\n", "workload.rate"},
      {"[workload]\nrate = inf\n[[mix]]\ntarget = \"a\"\n", "workload.rate"},
      {"[workload]\narrivals = \"bursty\"\n[[mix]]\ntarget = \"a\"\n", "workload.arrivals"},
      {"[[mix]]\ntarget = \"a\"\nmode = \"int4\"\n", "mix[0].mode"},
      {"[[mix]]\ntarget = \"a\"\nweight = 0\n", "mix[0].weight"},
      {"[[mix]]\nmode = \"auto\"\n", "mix[0].target"},
      {"[workload]\nrate = 5\n", "[[mix]]"},
      {"[prompt]\ndistribution = \"zipf\"\n[[mix]]\ntarget = \"a\"\n", "prompt.distribution"},
      {"[prompt]\ndistribution = \"uniform\"\nmin = 9\nmax = 3\n[[mix]]\ntarget = \"a\"\n",
       "min 9 above max 3"},
      {"[output]\ntokens = 2000000\n[[mix]]\ntarget = \"a\"\n", "output.tokens"},
      {"[prefix]\nshare = 1.5\n[[mix]]\ntarget = \"a\"\n", "prefix.share"},
      {"[slo]\nttft = 5\n[[mix]]\ntarget = \"a\"\n", "unknown key slo.ttft"},
      {"[mix]\ntarget = \"a\"\n", "mix: an array of tables"},
      {"[[mix]]\ntarget = \"a\"\n[[fault]]\nkind = \"flap\"\nnode = \"a-0\"\n",
       "the soak's 'flap' is not simulated yet"},
      {"[[mix]]\ntarget = \"a\"\n[[fault]]\nkind = \"sleep\"\nnode = \"a-0\"\n",
       "fault[0].kind: \"freeze\" or \"kill\""},
      {"[[mix]]\ntarget = \"a\"\n[[fault]]\nat_s = 1\n", "fault[0].node: needed"},
      {"[[mix]]\ntarget = \"a\"\n[[fault]]\nnode = \"a-0\"\nhold_s = 0\n", "fault[0].hold_s"},
      {"[[mix]]\ntarget = \"a\"\n[[fault]]\nnode = \"a-0\"\nat_s = -1\n", "fault[0].at_s"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SimWorkload> w = ParseSimWorkload(c.text);
    ASSERT_FALSE(w.ok()) << c.says;
    EXPECT_THAT(w.status().message(), HasSubstr(c.says)) << w.status();
  }
  // Against a deployment: a target that is no pool, codes to a pool without a producer.
  absl::StatusOr<SimDeployment> d = ParseSimDeployment(kDeployment, "", Profiles());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(CheckSimWorkload(*ParseSimWorkload(good), *d).ok());
  EXPECT_THAT(CheckSimWorkload(*ParseSimWorkload("[[mix]]\ntarget = \"z\"\n"), *d).message(),
              HasSubstr("no consumer pool 'z'"));
  EXPECT_THAT(CheckSimWorkload(*ParseSimWorkload("[[mix]]\ntarget = \"b\"\nmode = \"scd\"\n"), *d)
                  .message(),
              HasSubstr("has no producer"));
  // A fault's node is one of the deployment's (POOL-I), within the workload's window, shorter
  // than the lease, not overlapping another of its node's; faults are read in time order.
  const auto faults = [&](const std::string& text) {
    absl::StatusOr<SimWorkload> w = ParseSimWorkload(good + text);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? CheckSimWorkload(*w, *d) : w.status();
  };
  const std::string fault = "[[fault]]\nkind = \"freeze\"\n";
  EXPECT_TRUE(faults(fault + "node = \"a-3\"\nat_s = 5\n" + fault + "node = \"base-2\"\n").ok());
  EXPECT_THAT(faults(fault + "node = \"a-4\"\n").message(), HasSubstr("no node 'a-4'"));
  EXPECT_THAT(faults(fault + "node = \"c-0\"\n").message(), HasSubstr("fault[0].node"));
  EXPECT_THAT(faults(fault + "node = \"a\"\n").message(), HasSubstr("no node 'a'"));
  EXPECT_THAT(faults(fault + "node = \"a-0\"\nat_s = 61\n").message(), HasSubstr("past"));
  EXPECT_THAT(faults(fault + "node = \"a-0\"\nhold_s = 10\n").message(), HasSubstr("lease"));
  // A killed node may stay down past its lease (its registration lapses, as etcd's key would).
  const std::string kill = "[[fault]]\nkind = \"kill\"\n";
  absl::StatusOr<SimWorkload> long_kill =
      ParseSimWorkload(good + kill + "node = \"a-0\"\nhold_s = 30\n");
  ASSERT_TRUE(long_kill.ok()) << long_kill.status();
  EXPECT_EQ(long_kill->faults.at(0).kind, SimFaultKind::kKill);
  EXPECT_TRUE(faults(kill + "node = \"a-0\"\nhold_s = 30\n").ok());
  EXPECT_THAT(faults(kill + "node = \"a-0\"\nat_s = 2\nhold_s = 30\n" + fault +
                     "node = \"a-0\"\nat_s = 20\n")
                  .message(),
              HasSubstr("fault[1]: overlaps another fault of a-0"));
  EXPECT_THAT(
      faults(fault + "node = \"a-0\"\nat_s = 4\n" + fault + "node = \"a-0\"\nat_s = 2\n").message(),
      HasSubstr("fault[1]: overlaps another fault of a-0"));
  absl::StatusOr<SimWorkload> ordered = ParseSimWorkload(
      good + fault + "node = \"a-0\"\nat_s = 9\n" + fault + "node = \"a-1\"\nat_s = 2\n");
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  ASSERT_EQ(ordered->faults.size(), 2u);
  EXPECT_EQ(ordered->faults[0].node, "a-1");
  EXPECT_EQ(ordered->faults[1].at_s, 9);
}

}  // namespace
}  // namespace scd::bench
