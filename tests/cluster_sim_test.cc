// ClusterSim (bench/cluster_sim.h) against answers worked out by hand from the profiles: a lone
// local request's first token after its prefill and its tokens one decode step apart; a lone scd
// request's first token after the last layer's codes crossed the link, that layer's rebuild, its
// tail and the first decode, each layer in steps of its own; the same run twice gives the same
// results; under load every request ends, admission queueing, not losing them; what still runs past
// the drain ends DEADLINE_EXCEEDED, once, wherever it waited; a frozen node does nothing until its
// thaw, and one frozen past the keepalives -- or killed -- is ejected, its streams moved and its
// transfers failed into the consumers' own prefill, as the coordinator does; a killed node serves
// again once restarted.
#include "bench/cluster_sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace scd::bench {
namespace {

NodeProfile ProducerCosts(IdleCost idle = {}) {
  NodeProfile p;
  p.idle = idle;
  p.role = NodeRole::kProducer;
  p.model = "p";
  p.prefill = {1000, 50, 0.5};
  p.link_goodput_gbps = 1;
  return p;
}

NodeProfile ConsumerCosts(double api_us = 0, IdleCost idle = {}, StepNoise noise = {}) {
  NodeProfile p;
  p.step_noise = noise;
  p.api_overhead_us = api_us;
  p.idle = idle;
  p.role = NodeRole::kConsumer;
  p.model = "c";
  p.prefill = {800, 40, 0.25};
  p.rebuild = {0, 12};
  p.first_decode = {1500, 1};
  p.decode_step = {2000, 100, 2};
  p.kv_bytes_per_token = 1000;
  p.kv_budget_bytes = 1000 * 4096;
  p.capacity = 8;
  p.step_rows = 512;
  return p;
}

SimDeployment Deployment(int64_t consumers, double gbps, int64_t layers, double api_us = 0,
                         IdleCost idle = {}, IdleCost producer_idle = {}, StepNoise noise = {},
                         int64_t prefill_threads = 8) {
  const std::string text = absl::StrCat(
      "[deployment]\nheartbeat_ms = 100\n[[producer_pool]]\nname = \"base\"\nprofile = "
      "\"producer\"\nprefix_cache_mb = 4\nprefill_threads = ",
      prefill_threads,
      "\n"
      "[[consumer_pool]]\nname = \"c\"\nprofile = \"consumer\"\nproducer = "
      "\"base\"\nprefix_cache_mb = 4\n",
      "code_bytes_per_token = 500\ncount = ", consumers, "\nlayers = ", layers,
      "\n[[link]]\nproducer = \"base\"\nconsumer = \"c\"\ngbps = ", gbps, "\nlatency_us = 300\n");
  absl::StatusOr<SimDeployment> d = ParseSimDeployment(
      text, "",
      [api_us, idle, producer_idle, noise](const std::string& path) -> absl::StatusOr<NodeProfile> {
        return path == "producer" ? ProducerCosts(producer_idle)
                                  : ConsumerCosts(api_us, idle, noise);
      });
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

SimWorkload Workload(const std::string& mode, double rate, double duration_s, int64_t prompt,
                     int64_t output) {
  SimWorkload w;
  w.duration_s = duration_s;
  w.rate = rate;
  w.arrivals = SimArrivals::kConstant;
  w.prompt.tokens = prompt;
  w.output.tokens = output;
  SimMix m;
  m.target = "c";
  m.mode = *ParseRequestedMode(mode);
  w.mix = {m};
  return w;
}

TEST(ClusterSimTest, ALoneLocalRequestTakesItsPrefillThenADecodeStepPerToken) {
  // One request (constant arrivals at 1/s for 1.5 s), 100 prompt tokens, 5 out.
  const SimDeployment d = Deployment(1, 1, 4);
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, Workload("local", 1, 1.5, 100, 5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 1u);
  const SimRequestResult& q = r->requests[0];
  ASSERT_EQ(q.code, absl::StatusCode::kOk);
  EXPECT_EQ(q.mode, TransferMode::kLocal);
  const NodeProfile c = ConsumerCosts();
  // The whole prompt in one step (100 rows of 512, nothing decoding beside it).
  const double ttft_us = c.prefill.At(100, 0);
  EXPECT_NEAR(q.ttft_s * 1e6, ttft_us, 1);
  // Then four decode steps of one sequence over 100, 101, 102, 103 positions.
  double decode_us = 0;
  for (int64_t ctx = 100; ctx < 104; ++ctx) decode_us += c.decode_step.At(1, ctx);
  EXPECT_NEAR(q.e2el_s * 1e6, ttft_us + decode_us, 1);
  EXPECT_NEAR(q.tpot_s() * 1e6, decode_us / 4, 1);
}

TEST(ClusterSimTest, TheApiOverheadDelaysWhatTheClientSeesAndNoNodesWork) {
  // The same lone request with 4.5 ms between the client and the consumer: its TTFT and
  // end-to-end latency 4.5 ms later, its tokens as far apart; the consumer as busy.
  const SimWorkload w = Workload("local", 1, 1.5, 100, 5);
  absl::StatusOr<ClusterSimResult> plain = RunClusterSim(Deployment(1, 1, 4), w);
  absl::StatusOr<ClusterSimResult> api = RunClusterSim(Deployment(1, 1, 4, 4500), w);
  ASSERT_TRUE(plain.ok() && api.ok());
  const SimRequestResult &a = plain->requests.at(0), &b = api->requests.at(0);
  ASSERT_EQ(b.code, absl::StatusCode::kOk);
  EXPECT_NEAR((b.ttft_s - a.ttft_s) * 1e6, 4500, 1e-3);
  EXPECT_NEAR((b.e2el_s - a.e2el_s) * 1e6, 4500, 1e-3);
  EXPECT_NEAR(b.tpot_s(), a.tpot_s(), 1e-12);
  ASSERT_EQ(api->nodes.size(), plain->nodes.size());
  for (size_t i = 0; i < api->nodes.size(); ++i) {
    EXPECT_EQ(api->nodes[i].busy_s, plain->nodes[i].busy_s) << api->nodes[i].name;
  }
}

TEST(ClusterSimTest, WorkAfterIdleIsSlowerByTheShareOfTheIdleMeasured) {
  // The consumer measured 1.5x (p50 = p90: no spread to draw) and a hop of 6 ms instead of 1 ms
  // after 500 ms of idle. Two requests at 0.25 and 0.5 s: the first finds the node idle 250 ms
  // since the start (half the measured idle: 1.25x, a 3.5 ms hop); the second the time since
  // the first's last step; their decode steps, on a busy node, as measured.
  const IdleCost idle{500000, 1.5, 1.5, 6000};
  const SimWorkload w = Workload("local", 4, 0.6, 100, 5);
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(Deployment(1, 1, 4, 1000, idle), w);
  absl::StatusOr<ClusterSimResult> busy = RunClusterSim(Deployment(1, 1, 4, 1000), w);
  ASSERT_TRUE(r.ok() && busy.ok());
  ASSERT_EQ(r->requests.size(), 2u);
  const NodeProfile c = ConsumerCosts();
  const double prefill_us = c.prefill.At(100, 0);
  const SimRequestResult &a = r->requests[0], &b = r->requests[1];
  EXPECT_NEAR(a.ttft_s * 1e6, 1.25 * prefill_us + 3500, 1e-3);
  EXPECT_NEAR(a.tpot_s(), busy->requests[0].tpot_s(), 1e-12);
  const double share = (0.25 - (a.e2el_s - 3500e-6)) / 0.5;
  ASSERT_GT(share, 0.4);
  ASSERT_LT(share, 0.5);
  EXPECT_NEAR(b.ttft_s * 1e6, (1 + 0.5 * share) * prefill_us + 1000 + 5000 * share, 1e-3);
  // Without an [idle] table every request is as on a busy node.
  EXPECT_NEAR(busy->requests[0].ttft_s * 1e6, prefill_us + 1000, 1e-3);
  EXPECT_NEAR(busy->requests[1].ttft_s * 1e6, prefill_us + 1000, 1e-3);
}

TEST(ClusterSimTest, StepNoiseSpreadsStepsAroundTheirCostAndKeepsTheirMean) {
  // A lone request of 100 prompt tokens and 1,000 out, steps drawn from a spread of p10 0.5,
  // p50 1, p90 1.5, p99 3 (a standard deviation about 0.4 of the mean): its TPOT is the
  // noiseless one within 5 % (the mean of 999 draws: about 1.3 % standard error, so 4 of them),
  // but not equal to it; the same seed draws the same run.
  const StepNoise noise{0.5, 1, 1.5, 3};
  const SimWorkload w = Workload("local", 1, 1.5, 100, 1000);
  const SimDeployment noisy = Deployment(1, 1, 4, 0, {}, {}, noise);
  absl::StatusOr<ClusterSimResult> a = RunClusterSim(noisy, w), b = RunClusterSim(noisy, w);
  absl::StatusOr<ClusterSimResult> plain = RunClusterSim(Deployment(1, 1, 4), w);
  ASSERT_TRUE(a.ok() && b.ok() && plain.ok());
  const double tpot = a->requests[0].tpot_s(), want = plain->requests[0].tpot_s();
  EXPECT_NEAR(tpot, want, 0.05 * want);
  EXPECT_NE(tpot, want);
  EXPECT_EQ(tpot, b->requests[0].tpot_s());
  EXPECT_EQ(a->requests[0].ttft_s, b->requests[0].ttft_s);
}

// The simulated consumer keeps the daemon's step log (consumer/step_log.h) on simulated time:
// lone local requests 0.5 s apart, each a 100-token prefill step and 4 decode steps of one
// sequence. A line is written at the end of the first step 10 s after the last: a prefill, whose
// request's decodes fall in the next line -- so a line holds whole requests' decodes, and one
// prefill more or fewer than their requests.
TEST(ClusterSimTest, EachConsumerLogsItsStepsAsTheDaemonDoes) {
  const SimDeployment d = Deployment(1, 1, 4);
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, Workload("local", 2, 25, 100, 5));
  ASSERT_TRUE(r.ok()) << r.status();
  const SimNodeUse& c = r->nodes.back();
  ASSERT_FALSE(c.producer);
  ASSERT_EQ(c.step_log.size(), 2u) << "25 s of steps: lines after 10 and 20 s";
  const NodeProfile k = ConsumerCosts();
  const double prefill_us = k.prefill.At(100, 0);
  double decodes_us = 0;  // a request's 4 decode steps
  for (int64_t ctx = 100; ctx < 104; ++ctx) decodes_us += k.decode_step.At(1, ctx);
  double last_t = 0;
  for (const std::string& line : c.step_log) {
    double t = 0, over = 0, busy = 0, each_ms = 0, decode = 0, batch = 0, prompt = 0;
    int steps = 0;
    ASSERT_EQ(std::sscanf(line.c_str(),
                          "t=%lf steps over %lf s: %d (busy %lf %%, %lf ms each), %lf decode "
                          "tokens/s in batches of %lf, %lf prompt tokens/s",
                          &t, &over, &steps, &busy, &each_ms, &decode, &batch, &prompt),
              8)
        << line;
    // The line's rates have one decimal: counts from them are within 0.05 a second.
    const double elapsed = t - last_t, slack = 0.06 * elapsed;
    EXPECT_GE(elapsed, 10.0) << line;
    EXPECT_NEAR(over, elapsed, 0.05) << line;
    const double decoded = 4 * std::round(decode * elapsed / 4);
    const double prefills = std::round(prompt * elapsed / 100);
    EXPECT_NEAR(decode * elapsed, decoded, slack) << line;
    EXPECT_NEAR(prompt * elapsed, 100 * prefills, slack) << line;
    EXPECT_LE(std::abs(prefills - decoded / 4), 1) << line;
    EXPECT_GE(prefills, 19) << line;  // 0.5 s apart over 10 s
    EXPECT_EQ(steps, prefills + decoded) << line;
    EXPECT_NEAR(batch, 1.0, 1e-9) << line;
    const double busy_us = prefills * prefill_us + decoded / 4 * decodes_us;
    EXPECT_NEAR(each_ms, busy_us / 1e3 / steps, 0.006) << line;
    EXPECT_NEAR(busy, 100 * busy_us / 1e6 / elapsed, 0.6) << line;
    last_t = t;
  }
}

TEST(ClusterSimTest, ALoneScdRequestWaitsForTheLastLayerThenItsRebuildAndFirstDecode) {
  // A slow link (0.001 Gb/s = 125 kB/s): each layer's codes (99 tokens x 500 B / 4 layers =
  // 12,375 B, 99 ms) leave as the pass has them and queue on the link.
  const SimDeployment d = Deployment(1, 0.001, 4);
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, Workload("scd", 1, 1.5, 100, 3));
  ASSERT_TRUE(r.ok()) << r.status();
  const SimRequestResult& q = r->requests[0];
  ASSERT_EQ(q.code, absl::StatusCode::kOk);
  EXPECT_EQ(q.mode, TransferMode::kScd);
  const NodeProfile p = ProducerCosts(), c = ConsumerCosts();
  const double prefill_us = p.prefill.At(99, 0);  // the prompt less its last token
  const double layer_us = 99.0 * 500 / 4 / (0.001e9 / 8) * 1e6;
  // Layer 0 leaves at a quarter of the pass; the link is then busy to the end.
  double link_free = prefill_us / 4;
  for (int l = 0; l < 4; ++l) link_free = std::max(link_free, prefill_us * (l + 1) / 4) + layer_us;
  const double arrived = link_free + 300;
  // As the daemon's receive runs it (consumer/code_receiver.h), each in a step of its own: the
  // last layer's piece, the prompt's last token through that layer (a quarter of a one-sequence
  // step), the last logits; then the first decode.
  const double rebuild_us = 99.0 * c.rebuild.per_token_us / 4;
  const double tail_us = c.decode_step.At(1, 100) / 4;
  EXPECT_NEAR(q.ttft_s * 1e6, arrived + rebuild_us + tail_us + c.first_decode.At(100), 1);
  EXPECT_NEAR(q.tpot_s() * 1e6, (c.decode_step.At(1, 100) + c.decode_step.At(1, 101)) / 2, 1);
  // Its consumer's steps: each layer's piece and tail apart (the next layer is taken after the
  // tail), the last logits, the first decode, two more decodes.
  const SimNodeUse& consumer = r->nodes.back();
  ASSERT_FALSE(consumer.producer);
  EXPECT_EQ(consumer.steps, 4 * 2 + 1 + 1 + 2);
  // A producer measured 2x after 100 ms of idle, found idle 1 s since the start: its pass twice
  // as long, each layer out at twice the time; on a link fast enough to keep up, the last layer
  // arrives after the whole slowed pass and its own bytes.
  const SimDeployment fast = Deployment(1, 100, 4, 0, {}, {100000, 2, 2, 0});
  const SimDeployment plain = Deployment(1, 100, 4);
  absl::StatusOr<ClusterSimResult> slow = RunClusterSim(fast, Workload("scd", 1, 1.5, 100, 3));
  absl::StatusOr<ClusterSimResult> busy = RunClusterSim(plain, Workload("scd", 1, 1.5, 100, 3));
  ASSERT_TRUE(slow.ok() && busy.ok());
  EXPECT_NEAR((slow->requests[0].ttft_s - busy->requests[0].ttft_s) * 1e6, prefill_us, 1e-3);
}

// A producer's passes share it as the daemon's prefill threads share its CPU: two scd requests
// g = 1 ms apart, each pass W alone. One at a time (prefill_threads = 1) the first's codes are
// all out at W; shared, the first runs alone for g, then at half speed: its last layer out at
// 2W - g -- later by W - g, and by the second's last piece and tail, which now land before its
// last logits. Either way the producer works 2W in all.
TEST(ClusterSimTest, ALinksTraceSetsItsRateOverSimulatedTime) {
  // scd requests at 1, 2, 3 and 4 s, each 100 tokens of 500 B codes (~50 kB: 0.4 s at 1 Mbit/s).
  // A trace of one step at 1 Mbit/s runs as that rate does; one that lifts the limit at 2.2 s
  // leaves the first request as slow, the second between (its codes cross at both rates), and
  // the later ones as fast as an unlimited link.
  const SimWorkload w = Workload("scd", 1, 4.5, 100, 4);
  const SimDeployment slow = Deployment(1, 0.001, 4), fast = Deployment(1, 1e6, 4);
  SimDeployment one = slow, lifted = slow;
  one.links[0].steps =
      std::make_shared<const std::vector<TraceStep>>(std::vector<TraceStep>{{0, 0.001}});
  lifted.links[0].steps = std::make_shared<const std::vector<TraceStep>>(
      std::vector<TraceStep>{{0, 0.001}, {2.2, INFINITY}});
  absl::StatusOr<ClusterSimResult> a = RunClusterSim(slow, w), b = RunClusterSim(one, w),
                                   c = RunClusterSim(lifted, w), f = RunClusterSim(fast, w);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && f.ok());
  ASSERT_EQ(a->requests.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(c->requests[i].code, absl::StatusCode::kOk);
    EXPECT_EQ(b->requests[i].ttft_s, a->requests[i].ttft_s) << i;
  }
  EXPECT_GT(a->requests[0].ttft_s, f->requests[0].ttft_s + 0.3);  // the link is what differs
  EXPECT_EQ(c->requests[0].ttft_s, a->requests[0].ttft_s);
  EXPECT_LT(c->requests[1].ttft_s, a->requests[1].ttft_s - 0.05);
  EXPECT_GT(c->requests[1].ttft_s, f->requests[1].ttft_s + 0.05);
  for (size_t i = 2; i < 4; ++i) EXPECT_NEAR(c->requests[i].ttft_s, f->requests[i].ttft_s, 1e-6);
}

TEST(ClusterSimTest, AProducersPassesShareItAsItsPrefillThreadsDo) {
  const SimWorkload w = Workload("scd", 1000, 0.0025, 200, 2);  // arrivals 1 ms apart
  absl::StatusOr<ClusterSimResult> shared = RunClusterSim(Deployment(1, 100, 4), w);
  absl::StatusOr<ClusterSimResult> serial =
      RunClusterSim(Deployment(1, 100, 4, 0, {}, {}, {}, 1), w);
  ASSERT_TRUE(shared.ok() && serial.ok());
  ASSERT_EQ(shared->requests.size(), 2u);
  ASSERT_EQ(serial->requests.size(), 2u);
  const SimRequestResult &a = shared->requests[0], &a1 = serial->requests[0];
  ASSERT_EQ(a.code, absl::StatusCode::kOk);
  ASSERT_EQ(a1.code, absl::StatusCode::kOk);
  const double gap_us = (shared->requests[1].arrival_s - a.arrival_s) * 1e6;
  EXPECT_NEAR(gap_us, 1000, 1e-3);
  const double pass_us = ProducerCosts().prefill.At(199, 0);  // the prompt less its last token
  // Shared, the second's last layer lands g after the first's, while the first's last piece and
  // tail run (P + T > g): the consumer's queue runs in order (step_plan.h), so the second's piece
  // goes before the first's last logits and its tail beside the first's first decode.
  const NodeProfile c = ConsumerCosts();
  const double piece_us = 199.0 * c.rebuild.per_token_us / 4,
               tail_us = c.decode_step.At(1, 200) / 4;
  ASSERT_GT(piece_us + tail_us, gap_us);
  EXPECT_NEAR((a.ttft_s - a1.ttft_s) * 1e6, pass_us - gap_us + piece_us + tail_us, 0.01);
  for (const ClusterSimResult* r : {&*shared, &*serial}) {
    const SimNodeUse& producer = r->nodes.front();
    ASSERT_TRUE(producer.producer);
    EXPECT_NEAR(producer.busy_s * 1e6, 2 * pass_us, 0.01);
    EXPECT_EQ(producer.served, 2);
  }
}

TEST(ClusterSimTest, UnderLoadEveryRequestEndsAndTheSameSeedGivesTheSameRun) {
  const SimDeployment d = Deployment(3, 1, 4);
  SimWorkload w = Workload("auto", 40, 20, 200, 32);
  w.arrivals = SimArrivals::kPoisson;
  w.seed = 5;
  w.prompt = {SimLengthKind::kUniform, 0, 16, 400};
  w.prefix_groups = 4;
  w.prefix_share = 0.5;
  absl::StatusOr<ClusterSimResult> a = RunClusterSim(d, w);
  absl::StatusOr<ClusterSimResult> b = RunClusterSim(d, w);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_GT(a->requests.size(), 600u);
  ASSERT_EQ(a->requests.size(), b->requests.size());
  int ok = 0, local = 0, cached = 0;
  for (size_t i = 0; i < a->requests.size(); ++i) {
    const SimRequestResult &x = a->requests[i], &y = b->requests[i];
    EXPECT_EQ(x.code, y.code);
    EXPECT_EQ(x.ttft_s, y.ttft_s);
    EXPECT_EQ(x.e2el_s, y.e2el_s);
    EXPECT_EQ(x.consumer, y.consumer);
    ok += x.code == absl::StatusCode::kOk;
    local += x.mode == TransferMode::kLocal;
    cached += x.producer_cached + x.consumer_cached > 0;
    if (x.code == absl::StatusCode::kOk) {
      EXPECT_GT(x.ttft_s, 0);
      EXPECT_GE(x.e2el_s, x.ttft_s);
    }
  }
  EXPECT_EQ(ok, static_cast<int>(a->requests.size()));
  EXPECT_GT(cached, 0);  // the groups' prefixes hit the caches
  EXPECT_GT(a->events, 0);
  for (const SimNodeUse& n : a->nodes) EXPECT_GT(n.busy_s, 0) << n.name;
}

TEST(ClusterSimTest, ATimelineSpreadsWorkOverTheBinsItCovers) {
  SimTimeline t;
  t.bin_s = 1;
  t.Add(0.5, 2.0);
  EXPECT_EQ(t.seconds, (std::vector<double>{0.5, 1.0, 0.5}));
  t.Add(5.0, 0.25);
  EXPECT_EQ(t.seconds, (std::vector<double>{0.5, 1.0, 0.5, 0, 0, 0.25}));
  t.Add(-1, 0.5);  // before the start: nothing
  t.Add(3, 0);
  EXPECT_EQ(t.seconds.size(), 6u);
  EXPECT_EQ(SimTimelineBin(600), 6);
  EXPECT_EQ(SimTimelineBin(0.1), 0.01);
}

TEST(ClusterSimTest, EachNodesUseOverTimeAddsUpToItsTotalAndNeverPassesItsBin) {
  // The load above: every node's busy time and every producer's link time, bin by bin, sum to
  // its totals, and no bin holds more than the bin (one node computes, one link carries, at a
  // time); the consumers busy while requests arrive, idle once the run drained.
  const SimDeployment d = Deployment(3, 0.05, 4);
  SimWorkload w = Workload("auto", 40, 20, 200, 32);
  w.arrivals = SimArrivals::kPoisson;
  w.prompt = {SimLengthKind::kUniform, 0, 16, 400};
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, w);
  ASSERT_TRUE(r.ok()) << r.status();
  const double bin = SimTimelineBin(w.duration_s);
  bool linked = false;
  for (const SimNodeUse& n : r->nodes) {
    for (const auto& [timeline, total] :
         {std::pair{&n.busy_over_time, n.busy_s}, std::pair{&n.link_over_time, n.link_s}}) {
      EXPECT_EQ(timeline->bin_s, bin);
      double sum = 0;
      for (double s : timeline->seconds) {
        EXPECT_LE(s, bin * (1 + 1e-9)) << n.name;
        sum += s;
      }
      EXPECT_NEAR(sum, total, 1e-9 * std::max(1.0, total)) << n.name;
      EXPECT_LE(static_cast<double>(timeline->seconds.size()) * bin, r->simulated_s + bin);
    }
    linked |= n.link_s > 0;
    if (!n.producer) {
      ASSERT_GT(n.busy_over_time.seconds.size(), 50u) << n.name;
      EXPECT_GT(n.busy_over_time.seconds[50], 0) << n.name;  // 10 s in
    }
  }
  EXPECT_TRUE(linked);
}

TEST(ClusterSimTest, WhatStillRunsPastTheDrainEndsDeadlineExceededWaitingOrNot) {
  // 100 requests/s of 100-token outputs on one consumer of capacity 8 (each ~0.4 s, ~20 a
  // second): at the end some decode, some wait in the producer's queue and most wait for
  // admission (fewer than its 256 places); 0.05 s after the last arrival each of them ends
  // DEADLINE_EXCEEDED, once.
  const SimDeployment d = Deployment(1, 1, 4);
  absl::StatusOr<ClusterSimResult> r =
      RunClusterSim(d, Workload("scd", 100, 2.005, 100, 100), 0.05);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 200u);
  int ok = 0, late = 0;
  for (const SimRequestResult& q : r->requests) {
    ok += q.code == absl::StatusCode::kOk;
    late += q.code == absl::StatusCode::kDeadlineExceeded;
  }
  EXPECT_GT(ok, 10);
  EXPECT_GT(late, 100);
  EXPECT_EQ(ok + late, 200);
}

// The soak's freeze replayed (bench/sim_faults.h), shorter than the keepalives' patience (the
// coordinator's pings every 0.5 s from the start, 1 s to answer; the transfer sessions' every
// 0.25 s, 0.75 s: a freeze from 1.001 s meets pings whose deadlines are 2.5 s and 2 s), on a lone
// request arriving at 1 s: a consumer frozen for 0.9 s from 1 ms into its prefill step ends that
// step 0.9 s later, so the first token and the end come 0.9 s later and the tokens stay as far
// apart; a request arriving at a consumer frozen from 0.5 s to 1.4 s is taken at the thaw, 0.4 s
// late; a producer frozen for 0.9 s inside a pass (~6 ms) sends every layer's codes, and so the
// first token, 0.9 s later.
TEST(ClusterSimTest, AFrozenNodeDoesNothingUntilItsThaw) {
  const SimDeployment d = Deployment(1, 100, 4);
  SimWorkload local = Workload("local", 1, 1.5, 100, 5);
  absl::StatusOr<ClusterSimResult> plain = RunClusterSim(d, local);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const SimRequestResult a = plain->requests.at(0);
  ASSERT_EQ(a.arrival_s, 1);
  local.faults = {{SimFaultKind::kFreeze, "c-0", 1.001, 0.9}};
  absl::StatusOr<ClusterSimResult> mid = RunClusterSim(d, local);
  ASSERT_TRUE(mid.ok()) << mid.status();
  const SimRequestResult& b = mid->requests.at(0);
  ASSERT_EQ(b.code, absl::StatusCode::kOk);
  EXPECT_EQ(b.moves, 0);
  EXPECT_NEAR(b.ttft_s - a.ttft_s, 0.9, 1e-6);
  EXPECT_NEAR(b.e2el_s - a.e2el_s, 0.9, 1e-6);
  EXPECT_NEAR(b.tpot_s(), a.tpot_s(), 1e-9);
  EXPECT_NEAR(mid->nodes.back().busy_s, plain->nodes.back().busy_s, 1e-9);  // none of it worked
  local.faults = {{SimFaultKind::kFreeze, "c-0", 0.5, 0.9}};
  absl::StatusOr<ClusterSimResult> before = RunClusterSim(d, local);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_NEAR(before->requests.at(0).ttft_s - a.ttft_s, 0.4, 1e-6);
  EXPECT_NEAR(before->requests.at(0).tpot_s(), a.tpot_s(), 1e-9);

  SimWorkload scd = Workload("scd", 1, 1.5, 100, 3);
  absl::StatusOr<ClusterSimResult> codes = RunClusterSim(d, scd);
  ASSERT_TRUE(codes.ok()) << codes.status();
  ASSERT_GT(ProducerCosts().prefill.At(99, 0), 2000);  // the pass outlasts the freeze's start
  scd.faults = {{SimFaultKind::kFreeze, "base-0", 1.001, 0.9}};
  absl::StatusOr<ClusterSimResult> producer = RunClusterSim(d, scd);
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_EQ(producer->requests.at(0).mode, TransferMode::kScd);
  EXPECT_FALSE(producer->requests.at(0).fell_back);
  EXPECT_NEAR(producer->requests.at(0).ttft_s - codes->requests.at(0).ttft_s, 0.9, 1e-6);
  EXPECT_NEAR(producer->nodes.front().busy_s, codes->nodes.front().busy_s, 1e-9);
}

// A consumer frozen past the coordinator's keepalive (from 1.001 s for 3 s: given up at 2.5 s) is
// ejected and its streams move to the other replica (coordinator/routed_request.h `move`): a lone
// request frozen in its prefill is prefilled again there from 2.5 s, its first token 1.5 s later
// than unfrozen and its tokens as far apart; alone on a consumer with no other replica it ends
// UNAVAILABLE, as the real coordinator ends a stream it cannot move; a stream begun from codes
// moves from codes.
// `w` run on `d`, every request ended OK.
ClusterSimResult RunAllOk(const SimDeployment& d, const SimWorkload& w) {
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, w);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  for (const SimRequestResult& q : r->requests) {
    EXPECT_EQ(q.code, absl::StatusCode::kOk) << q.arrival_s;
  }
  return *std::move(r);
}

// `w` on two replicas, c-0 out of routing over (`out_from`, `out_to`): every request ends OK, some
// streams moved, none arriving meanwhile went to c-0 and some arriving after did.
ClusterSimResult ExpectC0OutThenBack(const SimDeployment& two, const SimWorkload& w,
                                     double out_from, double out_to) {
  ClusterSimResult r = RunAllOk(two, w);
  int moved = 0, after = 0;
  for (const SimRequestResult& q : r.requests) {
    moved += q.moves;
    if (q.arrival_s > out_from && q.arrival_s < out_to) {
      EXPECT_EQ(q.consumer, "c-1") << q.arrival_s;
    }
    if (q.arrival_s > out_to && q.consumer == "c-0") ++after;
  }
  EXPECT_GT(moved, 0);
  EXPECT_GT(after, 0);
  return r;
}

// A lone local request (at 1 s, 100 prompt tokens, 5 out) whose consumer meets a fault of `kind`
// for `hold_s` from 1.001 s: on two replicas it moves to the other, its first token `later` s
// later than without the fault and its tokens as far apart; on one replica it ends UNAVAILABLE.
void ExpectALoneStreamToMove(SimFaultKind kind, double hold_s, double later) {
  const SimDeployment two = Deployment(2, 100, 4);
  SimWorkload w = Workload("local", 1, 1.5, 100, 5);
  absl::StatusOr<ClusterSimResult> plain = RunClusterSim(two, w);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const SimRequestResult a = plain->requests.at(0);
  w.faults = {{kind, a.consumer, 1.001, hold_s}};
  absl::StatusOr<ClusterSimResult> moved = RunClusterSim(two, w);
  ASSERT_TRUE(moved.ok()) << moved.status();
  const SimRequestResult& b = moved->requests.at(0);
  ASSERT_EQ(b.code, absl::StatusCode::kOk);
  EXPECT_EQ(b.moves, 1);
  EXPECT_NE(b.consumer, a.consumer);
  EXPECT_NEAR(b.ttft_s - a.ttft_s, later, 1e-6);
  EXPECT_NEAR(b.tpot_s(), a.tpot_s(), 1e-9);
  absl::StatusOr<ClusterSimResult> alone = RunClusterSim(Deployment(1, 100, 4), w);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->requests.at(0).code, absl::StatusCode::kUnavailable);
}

TEST(ClusterSimTest, AConsumerLostToItsCoordinatorHasItsStreamsMovedToAnotherReplica) {
  ExpectALoneStreamToMove(SimFaultKind::kFreeze, 3, 1.5);
  const SimDeployment two = Deployment(2, 100, 4);

  // A stream that began from codes, frozen once its first token came (50 tokens, ~0.2 s): it
  // moves from codes -- the prompt's codes again from the producer, its tokens so far prefilled
  // on top -- not to local prefill, and streams the rest there.
  SimWorkload scd = Workload("scd", 1, 1.5, 100, 50);
  absl::StatusOr<ClusterSimResult> codes = RunClusterSim(two, scd);
  ASSERT_TRUE(codes.ok()) << codes.status();
  const SimRequestResult c = codes->requests.at(0);
  ASSERT_EQ(c.code, absl::StatusCode::kOk);
  ASSERT_LT(c.ttft_s + 0.005, c.e2el_s);
  scd.faults = {{SimFaultKind::kFreeze, c.consumer, 1 + c.ttft_s + 0.001, 3}};
  absl::StatusOr<ClusterSimResult> from_codes = RunClusterSim(two, scd);
  ASSERT_TRUE(from_codes.ok()) << from_codes.status();
  const SimRequestResult& m = from_codes->requests.at(0);
  ASSERT_EQ(m.code, absl::StatusCode::kOk);
  EXPECT_EQ(m.moves, 1);
  EXPECT_NE(m.consumer, c.consumer);
  EXPECT_EQ(m.producer, "base-0");
  EXPECT_FALSE(m.fell_back);
  EXPECT_NEAR(m.ttft_s, c.ttft_s, 1e-9);  // its first token came before the freeze
  EXPECT_GT(m.e2el_s, 2.5 - 1);           // the rest after the move at 2.5 s
  // The producer prefilled the prompt twice: once for each replica.
  EXPECT_EQ(from_codes->nodes.front().served, 2);
  EXPECT_EQ(codes->nodes.front().served, 1);
}

// Under load (20 requests/s of 50 tokens, ~0.14 s each, both replicas busy), a replica frozen
// from 1.081 s to 4.081 s, while it streams the requests of 1 s and 1.05 s: every request ends
// OK; those it held when its coordinator gave up on it (2.5 s) moved, mid-stream ones with their
// tokens so far prefilled on the other; none arriving while it is out of routing goes to it (2.5
// s until its probes, every 0.2 s from then, fail at 3 s and 3.8 s, pass at the thaw and at 4.3
// s), and it serves again afterwards.
TEST(ClusterSimTest, AnEjectedConsumerGetsNoRequestUntilItsProbesPassThenServesAgain) {
  const SimDeployment two = Deployment(2, 100, 4);
  SimWorkload w = Workload("local", 20, 6, 100, 50);
  absl::StatusOr<ClusterSimResult> plain = RunClusterSim(two, w);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::set<std::string> used;
  for (const SimRequestResult& q : plain->requests) used.insert(q.consumer);
  ASSERT_EQ(used.size(), 2u);  // the load spreads over both
  w.faults = {{SimFaultKind::kFreeze, "c-0", 1.081, 3}};
  const ClusterSimResult r = ExpectC0OutThenBack(two, w, 2.5, 4.3);
  for (const SimRequestResult& q : r.requests) {
    if (q.moves > 0) {
      EXPECT_EQ(q.consumer, "c-1");
      EXPECT_LT(q.arrival_s, 2.5);
    }
  }
  // The sequence frozen mid-stream: its first token came before the freeze.
  EXPECT_TRUE(std::any_of(r.requests.begin(), r.requests.end(), [](const SimRequestResult& q) {
    return q.moves > 0 && q.arrival_s + q.ttft_s < 1.081;
  }));
}

// A lone local request's first token on `d` (at 1 s, 100 prompt tokens): a consumer's own
// prefill, L.
double LonePrefillSeconds(const SimDeployment& d) {
  absl::StatusOr<ClusterSimResult> local = RunClusterSim(d, Workload("local", 1, 1.5, 100, 3));
  EXPECT_TRUE(local.ok()) << local.status();
  return local.ok() ? local->requests.at(0).ttft_s : 0;
}

// A producer frozen past its sessions' keepalive and its coordinator's, one lone request at a time
// (100 prompt tokens, a consumer's own prefill L): a transfer whose pass runs at the freeze
// (1.001 s) fails at the sessions' give-up (2 s) into the consumer's own prefill, first token at
// 1 s + L; with a freeze from 0.3 s to 3.3 s, a request at 1 s waits in the producer's queue until
// the coordinator gives up on it (1.5 s: 0.5 s + L); at 2 s and 3 s the producer is out of
// routing and the requests route local, the clients allowing the fallback (L); at 4 s its probes
// passed twice after the thaw (3.3 s, 3.5 s) and codes are back.
TEST(ClusterSimTest, AProducerLostFailsItsTransfersIntoTheConsumersOwnPrefill) {
  const SimDeployment d = Deployment(1, 100, 4);
  const double l = LonePrefillSeconds(d);
  SimWorkload scd = Workload("scd", 1, 1.5, 100, 3);
  scd.faults = {{SimFaultKind::kFreeze, "base-0", 1.001, 3}};
  absl::StatusOr<ClusterSimResult> running = RunClusterSim(d, scd);
  ASSERT_TRUE(running.ok()) << running.status();
  const SimRequestResult& q = running->requests.at(0);
  ASSERT_EQ(q.code, absl::StatusCode::kOk);
  EXPECT_EQ(q.mode, TransferMode::kScd);  // as routed
  EXPECT_TRUE(q.fell_back);
  EXPECT_NEAR(q.ttft_s, 1 + l, 1e-6);

  scd = Workload("scd", 1, 4.5, 100, 3);
  scd.faults = {{SimFaultKind::kFreeze, "base-0", 0.3, 3}};
  const ClusterSimResult r = RunAllOk(d, scd);
  ASSERT_EQ(r.requests.size(), 4u);
  EXPECT_TRUE(r.requests[0].fell_back);
  EXPECT_EQ(r.requests[0].mode, TransferMode::kScd);
  EXPECT_NEAR(r.requests[0].ttft_s, 0.5 + l, 1e-6);
  for (size_t i : {1, 2}) {
    EXPECT_EQ(r.requests[i].mode, TransferMode::kLocal) << i;
    EXPECT_FALSE(r.requests[i].fell_back);
    EXPECT_NEAR(r.requests[i].ttft_s, l, 1e-6) << i;
  }
  EXPECT_EQ(r.requests[3].mode, TransferMode::kScd);
  EXPECT_FALSE(r.requests[3].fell_back);
}

// The soak's kill (kill -9, restarted `hold_s` later): the node's connections reset at once, so
// the coordinator ejects it with no keepalive to wait for. A lone request whose consumer is killed
// 1 ms into its prefill is prefilled again on the other replica from then (its first token 1 ms
// later than unkilled); with no other replica it ends UNAVAILABLE.
TEST(ClusterSimTest, AKilledConsumersStreamsMoveAtOnce) {
  ExpectALoneStreamToMove(SimFaultKind::kKill, 2, 0.001);
}

// Under load (20 requests/s of 50 tokens, both replicas busy), c-0 killed at 1.081 s while it
// streams: every request ends OK, those it held moved; none arriving while it is down goes to it
// and it serves again once restarted -- down 1 s, and down 12 s, past the lease (10 s): its
// registration lapsed and it registers anew.
TEST(ClusterSimTest, AKilledConsumerServesAgainOnceRestartedEvenPastItsLease) {
  const SimDeployment two = Deployment(2, 100, 4);
  ASSERT_LT(two.lease_s, 12);
  for (const double down : {1.0, 12.0}) {
    SimWorkload w = Workload("local", 20, 4 + down, 100, 50);
    SCOPED_TRACE(down);
    w.faults = {{SimFaultKind::kKill, "c-0", 1.081, down}};
    ExpectC0OutThenBack(two, w, 1.081, 1.081 + down);
  }
}

// A producer killed 1 ms into a lone request's pass: the transfer fails at once into the
// consumer's own prefill (first token at 1 ms + L); killed for 2 s from 1.001 s, requests at 2 s
// and 3 s route local (no live producer; the clients allow the fallback), the one at 4 s, after
// its restart, from codes again -- unless its restart takes longer to be ready.
TEST(ClusterSimTest, AKilledProducersTransfersFallBackAtOnce) {
  const SimDeployment d = Deployment(1, 100, 4);
  const double l = LonePrefillSeconds(d);
  SimWorkload scd = Workload("scd", 1, 4.5, 100, 3);
  scd.faults = {{SimFaultKind::kKill, "base-0", 1.001, 2}};
  const ClusterSimResult r = RunAllOk(d, scd);
  ASSERT_EQ(r.requests.size(), 4u);
  EXPECT_TRUE(r.requests[0].fell_back);
  EXPECT_NEAR(r.requests[0].ttft_s, 0.001 + l, 1e-6);
  for (size_t i : {1, 2}) {
    EXPECT_EQ(r.requests[i].mode, TransferMode::kLocal) << i;
    EXPECT_NEAR(r.requests[i].ttft_s, l, 1e-6) << i;
  }
  EXPECT_EQ(r.requests[3].mode, TransferMode::kScd);
  EXPECT_FALSE(r.requests[3].fell_back);
  // A producer whose restart takes 1.5 s to be ready (its pool's restart_s) is back at 4.501 s:
  // the request at 4 s routes local too.
  SimDeployment slow = d;
  slow.producers[0].restart_s = 1.5;
  absl::StatusOr<ClusterSimResult> starting = RunClusterSim(slow, scd);
  ASSERT_TRUE(starting.ok()) << starting.status();
  EXPECT_EQ(starting->requests.at(3).mode, TransferMode::kLocal);
}

// A fault the deployment cannot take is refused before the run, naming it.
TEST(ClusterSimTest, AFaultOnANodeThatIsNoneOrPastTheLeaseIsRefused) {
  const SimDeployment d = Deployment(2, 100, 4);
  SimWorkload w = Workload("local", 1, 5, 100, 5);
  w.faults = {{SimFaultKind::kFreeze, "c-2", 1, 2}};
  absl::StatusOr<ClusterSimResult> r = RunClusterSim(d, w);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("c-2"), std::string::npos) << r.status();
  w.faults = {{SimFaultKind::kFreeze, "c-1", 1, d.lease_s}};
  r = RunClusterSim(d, w);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("lease"), std::string::npos) << r.status();
  w.faults = {{SimFaultKind::kFreeze, "c-1", 1, 2}, {SimFaultKind::kFreeze, "c-1", 2.5, 2}};
  r = RunClusterSim(d, w);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("overlaps"), std::string::npos) << r.status();
  w.faults = {{SimFaultKind::kFreeze, "c-1", 1, 2}, {SimFaultKind::kFreeze, "base-0", 1.5, 2}};
  EXPECT_TRUE(RunClusterSim(d, w).ok());
}

}  // namespace
}  // namespace scd::bench
