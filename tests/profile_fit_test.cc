// FitProfiles (bench/profile_fit.h) against profiles it did not see: samples made from a known
// producer and consumer profile by their formulas come back as those profiles (exactly without
// noise; within the noise with it), the decode steps from the gaps of streams decoding together,
// and too few samples are refused naming the cost.
#include "bench/profile_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace scd::bench {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 4;

NodeProfile TrueProducer() {
  NodeProfile p;
  p.role = NodeRole::kProducer;
  p.prefill = {900, 40, 0.05};
  p.encode = {60, 3};
  p.link_latency_us = 150;
  p.link_goodput_gbps = 2;  // 2 Gb/s: 4 us per KB
  return p;
}

NodeProfile TrueConsumer() {
  NodeProfile p;
  p.role = NodeRole::kConsumer;
  p.prefill = {700, 35, 0.04};
  p.rebuild = {200, 6};
  p.first_decode = {1500, 0.5};
  p.decode_step = {1200, 150, 0.25};
  return p;
}

// Every prompt length and cached prefix once in each mode; `noise` multiplies each cost by a
// factor drawn from [1, 1 + noise] (noise only adds time).
ProfileFitInput Samples(double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> extra(0, noise);
  auto jitter = [&](double us) { return us * (1 + extra(rng)); };
  const NodeProfile producer = TrueProducer(), consumer = TrueConsumer();
  ProfileFitInput in;
  for (int64_t prompt : {17, 33, 65, 129, 257}) {
    for (int64_t cached : {int64_t{0}, int64_t{16}, int64_t{64}}) {
      if (cached >= prompt - 1) continue;
      PromptSample local;
      local.local = true;
      local.prompt_tokens = prompt;
      local.consumer_cached = cached;
      local.prefill_us = jitter(consumer.prefill.At(prompt - cached, cached));
      in.prompts.push_back(local);
      PromptSample remote;
      remote.prompt_tokens = prompt;
      remote.producer_cached = cached;
      const int64_t n = prompt - 1 - cached;
      remote.prefill_us = jitter(producer.prefill.At(n, cached));
      remote.encode_us = jitter(producer.encode.At(static_cast<double>(n)));
      remote.rebuild_us = jitter(consumer.rebuild.At(static_cast<double>(prompt - 1)));
      remote.first_decode_us = jitter(consumer.first_decode.At(static_cast<double>(prompt)));
      remote.layers = kLayers;
      remote.payload_bytes = 1000 * (prompt - 1);
      remote.first_layer_out_us = 0.2 * remote.prefill_us;
      remote.last_layer_out_us = remote.prefill_us;
      // The last layer's bytes arrive a link time after the pass had them out.
      const double lag = jitter(producer.LinkUs(remote.payload_bytes / kLayers));
      remote.transfer_us = remote.last_layer_out_us + lag - remote.first_layer_out_us;
      in.prompts.push_back(remote);
    }
  }
  for (int64_t b : {1, 2, 4, 8}) {
    for (int64_t t : {64, 256, 1024}) {
      in.steps.push_back({b, b * t, jitter(consumer.decode_step.At(b, b * t))});
    }
  }
  in.producer_model = "p";
  in.consumer_model = "c";
  in.machine = "test";
  in.kv_bytes_per_token = 1024;
  in.kv_budget_bytes = 1 << 20;
  in.capacity = 8;
  in.step_rows = 256;
  return in;
}

TEST(ProfileFitTest, SamplesMadeByTheFormulasGiveTheProfilesBack) {
  absl::StatusOr<ProfileFitResult> r = FitProfiles(Samples(0, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  const NodeProfile p = TrueProducer(), c = TrueConsumer();
  auto near = [](double got, double want) { EXPECT_NEAR(got, want, 1e-6 * (1 + want)); };
  near(r->producer.prefill.fixed_us, p.prefill.fixed_us);
  near(r->producer.prefill.per_token_us, p.prefill.per_token_us);
  near(r->producer.prefill.per_token_context_us, p.prefill.per_token_context_us);
  near(r->producer.encode.per_token_us, p.encode.per_token_us);
  near(r->producer.link_latency_us, p.link_latency_us);
  near(r->producer.link_goodput_gbps, p.link_goodput_gbps);
  near(r->consumer.prefill.per_token_context_us, c.prefill.per_token_context_us);
  near(r->consumer.rebuild.per_token_us, c.rebuild.per_token_us);
  near(r->consumer.first_decode.fixed_us, c.first_decode.fixed_us);
  near(r->consumer.decode_step.fixed_us, c.decode_step.fixed_us);
  near(r->consumer.decode_step.per_sequence_us, c.decode_step.per_sequence_us);
  near(r->consumer.decode_step.per_context_token_us, c.decode_step.per_context_token_us);
  EXPECT_EQ(r->consumer.capacity, 8);
  EXPECT_EQ(r->fits.size(), 7u);
}

TEST(ProfileFitTest, NoisySamplesGiveCostsWithinTheirNoise) {
  // Each cost drawn up to 10 % above its formula (5 % on average): every fitted profile's cost
  // stays within [1, 1.1] of the true one at the sizes sampled.
  absl::StatusOr<ProfileFitResult> r = FitProfiles(Samples(0.10, 7));
  ASSERT_TRUE(r.ok()) << r.status();
  const NodeProfile p = TrueProducer(), c = TrueConsumer();
  for (int64_t n : {16, 64, 256}) {
    for (int64_t cached : {0, 64}) {
      const double producer = r->producer.prefill.At(n, cached) / p.prefill.At(n, cached);
      const double consumer = r->consumer.prefill.At(n, cached) / c.prefill.At(n, cached);
      EXPECT_GT(producer, 0.97) << n << " " << cached;
      EXPECT_LT(producer, 1.12) << n << " " << cached;
      EXPECT_GT(consumer, 0.97) << n << " " << cached;
      EXPECT_LT(consumer, 1.12) << n << " " << cached;
    }
  }
  for (int64_t b : {1, 8}) {
    const double step = r->consumer.decode_step.At(b, b * 256) / c.decode_step.At(b, b * 256);
    EXPECT_GT(step, 0.97);
    EXPECT_LT(step, 1.12);
  }
  for (const FitReport& f : r->fits) {
    EXPECT_LT(f.fit.rms_relative_residual, 0.1) << f.cost;
    EXPECT_GT(f.fit.rms_relative_residual, 0) << f.cost;
  }
}

TEST(ProfileFitTest, TheApiOverheadIsTheMedianOfWhatClientsSawBeyondTheServer) {
  // Five measured requests beyond their server's TTFT by 3, 9, 4, 5 and 4.5 ms (median 4.5 ms),
  // one with no client figure (not counted); none measured: 0.
  ProfileFitInput in = Samples(0, 1);
  ASSERT_GE(in.prompts.size(), 6u);
  const double beyond_ms[] = {3, 9, 4, 5, 4.5};
  for (int i = 0; i < 5; ++i) {
    in.prompts[i].server_ttft_us = 20000 + 1000 * i;
    in.prompts[i].client_ttft_us = in.prompts[i].server_ttft_us + 1000 * beyond_ms[i];
  }
  in.prompts[5].server_ttft_us = 30000;
  absl::StatusOr<ProfileFitResult> r = FitProfiles(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->consumer.api_overhead_us, 4500);
  EXPECT_EQ(FitProfiles(Samples(0, 1))->consumer.api_overhead_us, 0);
}

TEST(ProfileFitTest, PromptsAfterIdleGiveEachSidesSlowdownAndLeaveTheCostsAlone) {
  // Ten local and ten remote prompts after idle, copies of busy shapes with their prefills
  // 1.1x .. 2.0x (the consumer's) and 1.5x (the producer's), and the local ones' hop 6 ms after
  // 200..290 ms of idle: the consumer's slowdown median 1.5 (1.5 and 1.6's mean), its 90th
  // percentile the nearest rank from below (2.0), after the median idle (245 ms), hop 6 ms; the
  // producer's 1.5 and 1.5; every cost as without them.
  const ProfileFitInput busy = Samples(0, 1);
  ProfileFitInput in = busy;
  std::vector<PromptSample> local, remote;
  for (const PromptSample& s : busy.prompts) (s.local ? local : remote).push_back(s);
  for (int i = 0; i < 10; ++i) {
    PromptSample l = local[static_cast<size_t>(i) % local.size()];
    l.prefill_us *= 1.1 + 0.1 * i;
    l.idle_us = 200000 + 10000 * i;
    l.server_ttft_us = 30000;
    l.client_ttft_us = 36000;
    in.prompts.push_back(l);
    PromptSample r = remote[static_cast<size_t>(i) % remote.size()];
    r.prefill_us *= 1.5;
    r.idle_us = 250000;
    in.prompts.push_back(r);
  }
  absl::StatusOr<ProfileFitResult> with = FitProfiles(in), without = FitProfiles(busy);
  ASSERT_TRUE(with.ok() && without.ok()) << with.status();
  const IdleCost& c = with->consumer.idle;
  EXPECT_DOUBLE_EQ(c.after_us, 245000);
  EXPECT_NEAR(c.slowdown_p50, 1.55, 1e-12);
  EXPECT_NEAR(c.slowdown_p90, 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(c.api_overhead_us, 6000);
  EXPECT_DOUBLE_EQ(with->producer.idle.after_us, 250000);
  EXPECT_NEAR(with->producer.idle.slowdown_p50, 1.5, 1e-12);
  EXPECT_NEAR(with->producer.idle.slowdown_p90, 1.5, 1e-12);
  EXPECT_EQ(with->producer.idle.api_overhead_us, 0);
  EXPECT_EQ(with->consumer.api_overhead_us, without->consumer.api_overhead_us);
  with->consumer.idle = without->consumer.idle;
  with->producer.idle = without->producer.idle;
  EXPECT_EQ(NodeProfileToml(with->consumer), NodeProfileToml(without->consumer));
  EXPECT_EQ(NodeProfileToml(with->producer), NodeProfileToml(without->producer));
  // None after idle: no slowdown, and none written.
  EXPECT_EQ(without->consumer.idle.after_us, 0);
  EXPECT_THAT(NodeProfileToml(without->consumer), ::testing::Not(HasSubstr("[idle]")));
  // An idle sample faster than its busy shape is no speed-up: the slowdown is at least 1.
  ProfileFitInput fast = busy;
  PromptSample f = local[0];
  f.prefill_us *= 0.8;
  f.idle_us = 100000;
  fast.prompts.push_back(f);
  EXPECT_EQ(FitIdle(fast, true).slowdown_p50, 1);
  EXPECT_EQ(FitIdle(fast, true).slowdown_p90, 1);
}

TEST(ProfileFitTest, RepeatedShapesBecomeTheirMediansAndAnOutlierDoesNotMoveTheFit) {
  // Three runs of the same samples, one cost in each shape 1.2x, 1x and 1x (the median: 1x), and
  // one run's first step 5x (a stall): the fit is the formulas' exactly, as from one clean run.
  ProfileFitInput one = Samples(0, 1), three = one;
  three.prompts.clear();
  three.steps.clear();
  for (double scale : {1.2, 1.0, 1.0}) {
    for (PromptSample s : one.prompts) {
      s.prefill_us *= scale;
      s.rebuild_us *= scale;
      three.prompts.push_back(s);
    }
    for (StepSample s : one.steps) three.steps.push_back(s);
  }
  three.steps[0].step_us *= 5;
  const ProfileFitInput m = MedianByShape(three);
  ASSERT_EQ(m.prompts.size(), one.prompts.size());
  ASSERT_EQ(m.steps.size(), one.steps.size());
  for (size_t i = 0; i < m.prompts.size(); ++i) {
    EXPECT_EQ(m.prompts[i].prompt_tokens, one.prompts[i].prompt_tokens);  // first-seen order
    EXPECT_DOUBLE_EQ(m.prompts[i].prefill_us, one.prompts[i].prefill_us);
  }
  EXPECT_DOUBLE_EQ(m.steps[0].step_us, one.steps[0].step_us);
  absl::StatusOr<ProfileFitResult> a = FitProfiles(one), b = FitProfiles(three);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(NodeProfileToml(b->consumer), NodeProfileToml(a->consumer));
  EXPECT_EQ(NodeProfileToml(b->producer), NodeProfileToml(a->producer));
  // An even count's median is the mean of the middle two.
  ProfileFitInput two;
  two.steps = {{1, 10, 100}, {1, 10, 300}, {2, 20, 50}};
  const ProfileFitInput m2 = MedianByShape(two);
  ASSERT_EQ(m2.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(m2.steps[0].step_us, 200);
  EXPECT_DOUBLE_EQ(m2.steps[1].step_us, 50);
}

TEST(ProfileFitTest, AStepIsTheMeanLaterGapOfStreamsDecodingTogether) {
  // Three streams of 10-token prompts, 8 gaps each (the first of one of them long: a prefill
  // beside it, not counted): gaps 4..7 count, j + 1 ms each (mean 6.5 ms), at the context of gap
  // index 5.5 (rounded: 6): 3 * (10 + 6 + 1); the shortest stream bounds the half.
  std::vector<std::vector<double>> gaps(3, std::vector<double>(8));
  for (size_t s = 0; s < 3; ++s) {
    for (size_t j = 0; j < 8; ++j) gaps[s][j] = 0.001 * static_cast<double>(j + 1);
  }
  gaps[1][0] = 1.0;
  gaps[2].push_back(5.0);  // past the shortest stream's gaps
  const StepSample step = StepFromGaps(gaps, 10);
  EXPECT_EQ(step.sequences, 3);
  EXPECT_EQ(step.context_tokens, 3 * (10 + 6 + 1));
  EXPECT_NEAR(step.step_us, 6500, 1e-9);
  EXPECT_EQ(StepFromGaps({}, 10).sequences, 0);
  EXPECT_EQ(StepFromGaps({{0.1}}, 10).sequences, 0);
}

TEST(ProfileFitTest, StepRatiosAreEachLaterStepOverTheMeanWithLateDeliveriesSplit) {
  // Two streams, 8 gaps each, the later half 1, 1, 3, 0.2 ms and 1, 1, 1, 2 ms: the 0.2 under
  // half its stream's median (1 ms) was delivered with the 3 before it, so they are two steps of
  // 1.6; the mean step (1 + 1 + 1.6 + 1.6 + 1 + 1 + 1 + 2) / 8 = 1.275 ms.
  const std::vector<std::vector<double>> gaps = {{9, 9, 9, 9, 1, 1, 3, 0.2},
                                                 {9, 9, 9, 9, 1, 1, 1, 2}};
  const std::vector<double> r = StepRatios(gaps);
  const std::vector<double> steps = {1, 1, 1.6, 1.6, 1, 1, 1, 2};
  ASSERT_EQ(r.size(), steps.size());
  for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(r[i], steps[i] / 1.275, 1e-12) << i;
  EXPECT_TRUE(StepRatios({{0.1}}).empty());
  // Twenty ratios or more make the consumer's noise, their quantiles by nearest rank from below;
  // fewer, none.
  ProfileFitInput in = Samples(0, 1);
  for (int i = 0; i < 100; ++i) in.step_ratios.push_back(0.5 + 0.01 * i);
  absl::StatusOr<ProfileFitResult> fit = FitProfiles(in);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_DOUBLE_EQ(fit->consumer.step_noise.p10, 0.6);
  EXPECT_DOUBLE_EQ(fit->consumer.step_noise.p50, 1.0);
  EXPECT_DOUBLE_EQ(fit->consumer.step_noise.p90, 1.4);
  EXPECT_DOUBLE_EQ(fit->consumer.step_noise.p99, 1.49);
  in.step_ratios.resize(19);
  EXPECT_FALSE(FitProfiles(in)->consumer.step_noise.measured());
}

TEST(ProfileFitTest, TooFewSamplesAreRefusedNamingTheCost) {
  ProfileFitInput in = Samples(0, 1);
  in.steps.resize(5);  // 3 terms need 6
  absl::StatusOr<ProfileFitResult> r = FitProfiles(in);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("consumer.decode_step"));
  in = Samples(0, 1);
  for (PromptSample& s : in.prompts) s.local = true;  // no transfer seen
  r = FitProfiles(in);
  EXPECT_THAT(r.status().message(), HasSubstr("producer.prefill"));
  in = Samples(0, 1);
  in.capacity = 0;
  EXPECT_EQ(FitProfiles(in).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace scd::bench
