// NodeRegistry: leases (a silent node leaves routing in time), validation, and routing: target
// lookup, mode resolution per producer/consumer pair, fan-out to one producer, load balancing.
#include "coordinator/node_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "base/simulated_clock.h"
#include "coordinator/coordinator_service.h"
#include "proto/registry_client.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

// Resolve with the mode by name, as the coordinator's service parses it (proto edge): "" is auto,
// an unknown name INVALID_ARGUMENT.
absl::StatusOr<Route> ResolveNamed(const NodeRegistry& registry,
                                   const std::vector<std::string>& targets, const std::string& mode,
                                   const PrefixHint* hint = nullptr, double max_kl = 0,
                                   double ttft_slo_ms = 0) {
  absl::StatusOr<RequestedMode> parsed = ParseRequestedMode(mode);
  if (!parsed.ok()) return parsed.status();
  return registry.Resolve(targets, *parsed, hint, max_kl, ttft_slo_ms);
}

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kBaseFp[] = "aaaa000000000000base";
constexpr char kFablesFp[] = "bbbb00000000fables";
constexpr char kXsFp[] = "cccc000000000000xs";

class NodeRegistryTest : public ::testing::Test {
 protected:
  NodeRegistryTest() : registry_(RegistryOptions{}, &clock_) {}

  static v1::RegisterRequest Producer(const std::string& name, const std::string& fingerprint,
                                      const std::string& address = "10.0.0.1:7000") {
    v1::RegisterRequest request;
    SetNodeIdentity(v1::NODE_ROLE_PRODUCER, address, name, fingerprint, &request);
    request.add_transports("ucx");
    return request;
  }
  // A consumer of `name`, with an artifact for each producer fingerprint in `producers`.
  static v1::RegisterRequest Consumer(const std::string& name, const std::string& fingerprint,
                                      const std::vector<std::string>& producers,
                                      const std::string& address = "10.0.0.2:7001") {
    v1::RegisterRequest request;
    SetNodeIdentity(v1::NODE_ROLE_CONSUMER, address, name, fingerprint, &request);
    request.set_transfer_address(address + "1");
    for (const std::string& producer : producers) {
      auto* artifact = request.add_artifacts();
      artifact->set_id("art-" + producer.substr(0, 4) + "-" + fingerprint.substr(0, 4));
      artifact->set_producer_fingerprint(producer);
      artifact->set_consumer_fingerprint(fingerprint);
    }
    return request;
  }
  std::string Add(const v1::RegisterRequest& request) {
    absl::StatusOr<Lease> lease = registry_.Register(request);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? lease->node_id : "";
  }
  void Beat(const std::string& id, uint32_t active = 0) {
    v1::HeartbeatRequest beat;
    beat.set_node_id(id);
    beat.set_active_requests(active);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }
  // The fables consumer, its artifact for the base producer's codes with AddFrontier's points.
  std::string AddFablesWithFrontier();
  // A heartbeat reporting a measured prefill speed (us per computed token).
  void BeatSpeed(const std::string& id, double prefill_us_per_token, uint32_t active = 0) {
    v1::HeartbeatRequest beat;
    beat.set_node_id(id);
    beat.set_active_requests(active);
    beat.mutable_speeds()->mutable_prefill()->set_per_unit_us(prefill_us_per_token);
    beat.mutable_speeds()->mutable_prefill()->set_samples(4);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }

  SimulatedClock clock_{absl::FromUnixSeconds(1'000'000)};
  NodeRegistry registry_;
};

TEST_F(NodeRegistryTest, RegisterRefusesIncompleteRequests) {
  v1::RegisterRequest no_role = Producer("base", kBaseFp);
  no_role.set_role(v1::NODE_ROLE_UNSPECIFIED);
  EXPECT_EQ(registry_.Register(no_role).status().code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest no_address = Producer("base", kBaseFp);
  no_address.clear_address();
  EXPECT_EQ(registry_.Register(no_address).status().code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest no_transfer = Consumer("fables", kFablesFp, {});
  no_transfer.clear_transfer_address();
  EXPECT_EQ(registry_.Register(no_transfer).status().code(), absl::StatusCode::kInvalidArgument);
  // An artifact for a model the node does not serve.
  v1::RegisterRequest wrong_artifact = Consumer("fables", kFablesFp, {kBaseFp});
  wrong_artifact.mutable_artifacts(0)->set_consumer_fingerprint(kXsFp);
  absl::Status status = registry_.Register(wrong_artifact).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not serve"));
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(NodeRegistryTest, SilentNodeLeavesRoutingWithinThreeSeconds) {
  // The bound: dropped within 3 s of the last heartbeat, sweep included.
  EXPECT_LT(registry_.options().lease + registry_.options().sweep_interval, absl::Seconds(3));
  Add(Producer("base", kBaseFp));
  const std::string consumer = Add(Consumer("fables", kFablesFp, {kBaseFp}));
  clock_.Advance(absl::Seconds(1));
  Beat(consumer);
  clock_.Advance(registry_.options().lease);  // exactly at the limit: still live
  ASSERT_TRUE(ResolveNamed(registry_, {"fables"}, "").ok());
  clock_.Advance(absl::Milliseconds(1));  // lapsed: no longer routed, even before the sweep
  absl::Status status = ResolveNamed(registry_, {"fables"}, "").status();
  // A known target without a live node is UNAVAILABLE (retry later), not NOT_FOUND.
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("no live consumer"));
  // The sweep drops it (and the producer, silent even longer); a late heartbeat must re-register.
  std::vector<std::string> dropped = registry_.ExpireLapsed();
  EXPECT_EQ(dropped.size(), 2u);
  EXPECT_EQ(registry_.size(), 0u);
  v1::HeartbeatRequest late;
  late.set_node_id(consumer);
  EXPECT_EQ(registry_.Heartbeat(late).code(), absl::StatusCode::kNotFound);
}

TEST_F(NodeRegistryTest, TheServiceSweepsLapsedNodesOnTheRegistrysClock) {
  RegistryService service(&registry_, ClusterSecret::Random(), nullptr);
  Add(Producer("base", kBaseFp));
  const absl::Duration lease = registry_.options().lease;
  const absl::Duration sweep = registry_.options().sweep_interval;
  // The sweeps that fall within the lease leave it; the first after it lapsed drops it.
  clock_.Advance(lease);
  EXPECT_EQ(registry_.size(), 1u);
  clock_.Advance(sweep);
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(NodeRegistryTest, DeregisterRemovesAtOnce) {
  const std::string id = Add(Consumer("fables", kFablesFp, {}));
  ASSERT_TRUE(registry_.Deregister(id).ok());
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "local").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_.Deregister(id).code(), absl::StatusCode::kNotFound);
}

// What the all-in-one server waits with before it serves: woken by the registration that makes
// the count, or ended at its deadline (exactly: not 1 us before).
TEST_F(NodeRegistryTest, AwaitSizeEndsAtTheRegistrationOrItsDeadline) {
  EXPECT_TRUE(registry_.AwaitSize(0, clock_.Now()));
  std::atomic<int> enough{-1};
  std::thread late([&] { enough = registry_.AwaitSize(1, clock_.Now() + absl::Seconds(1)); });
  clock_.AwaitPending(1);  // the wait is parked on the clock
  clock_.Advance(absl::Seconds(1) - absl::Microseconds(1));
  EXPECT_EQ(clock_.pending(), 1u) << "the wait ended before its deadline";
  clock_.Advance(absl::Microseconds(1));
  late.join();
  EXPECT_EQ(enough.load(), 0);
  std::thread woken([&] { enough = registry_.AwaitSize(1, clock_.Now() + absl::Seconds(1)); });
  clock_.AwaitPending(1);
  Add(Consumer("fables", kFablesFp, {}));
  woken.join();
  EXPECT_EQ(enough.load(), 1) << "the registration did not wake the wait";
}

TEST_F(NodeRegistryTest, UnknownTargetIsNotFoundAndNamesTheKnownOnes) {
  Add(Producer("base", kBaseFp));
  Add(Consumer("fables", kFablesFp, {kBaseFp}));
  Add(Consumer("xs", kXsFp, {}, "10.0.0.3:7001"));
  absl::Status status = ResolveNamed(registry_, {"fables", "nope"}, "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'nope'"));
  EXPECT_THAT(status.message(), HasSubstr("fables, xs"));
  EXPECT_EQ(ResolveNamed(registry_, {}, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNamed(registry_, {"xs", "xs"}, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNamed(registry_, {"xs"}, "telepathy").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NodeRegistryTest, AutoPicksScdWithArtifactRawForIdenticalWeightsElseLocal) {
  const std::string producer = Add(Producer("base", kBaseFp));
  Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  Add(Consumer("xs", kXsFp, {}, "10.0.0.3:7001"));
  Add(Consumer("base-copy", kBaseFp, {}, "10.0.0.4:7001"));
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables", "xs", "base-copy"}, "");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->producer_node, producer);
  EXPECT_EQ(route->producer_name, "base");
  ASSERT_EQ(route->targets.size(), 3u);
  EXPECT_EQ(route->targets[0].mode, TransferMode::kScd);
  EXPECT_EQ(route->targets[0].artifact_id, "art-aaaa-bbbb");
  EXPECT_EQ(route->targets[0].transfer_address, "10.0.0.2:70011");
  EXPECT_EQ(route->targets[1].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[1].mode_reason, HasSubstr("no artifact for base -> xs"));
  EXPECT_EQ(route->targets[2].mode, TransferMode::kRaw);
  EXPECT_THAT(route->targets[2].mode_reason, HasSubstr("identical weights"));
}

// A 2-layer frontier: int4 at 10 B/token KL 0.05, int8 at 40 KL 0.02 (recommended), f16 at 100
// KL 0.018 (the fitted configuration).
void AddFrontier(v1::ArtifactEntry* artifact) {
  auto add = [&](const char* dtype, uint32_t rank, double bytes, double kl) {
    v1::FrontierPointEntry* e = artifact->add_frontier();
    e->mutable_point()->set_code_dtype(dtype);
    for (uint32_t l = 0; l < 2; ++l) {
      e->mutable_point()->add_rank_k(rank);
      e->mutable_point()->add_rank_v(rank);
      e->mutable_point()->add_rank_h(0);
    }
    e->set_bytes_per_token(bytes);
    e->set_kl(kl);
  };
  add("int4", 2, 10, 0.05);
  add("int8", 4, 40, 0.02);
  add("f16", 8, 100, 0.018);
  artifact->set_recommended(1);
}

std::string NodeRegistryTest::AddFablesWithFrontier() {
  v1::RegisterRequest registration = Consumer("fables", kFablesFp, {kBaseFp});
  AddFrontier(registration.mutable_artifacts(0));
  return Add(registration);
}

// With the nodes' speeds in their heartbeats, auto weighs local prefill against the frontier's
// points by predicted TTFT (coordinator/auto_choice.h), over the link as shaped or measured.
TEST_F(NodeRegistryTest, AutoWeighsLocalAgainstPointsByPredictedTtft) {
  const std::string producer = Add(Producer("base", kBaseFp));
  const std::string consumer = AddFablesWithFrontier();
  // Before any speed is reported: the rule without a cost model (the recommended point).
  PrefixHint hint;
  hint.prompt_tokens = 4000;
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("the recommended one"));
  EXPECT_EQ(route->targets[0].predicted_ttft_us, 0);
  // Both prefill at 20 us per token; the consumer rebuilds at 1 us per token.
  for (const std::string& id : {producer, consumer}) {
    v1::HeartbeatRequest beat;
    beat.set_node_id(id);
    v1::LinearCost* prefill = beat.mutable_speeds()->mutable_prefill();
    prefill->set_per_unit_us(20);
    prefill->set_samples(4);
    if (id == consumer) {
      beat.mutable_speeds()->mutable_rebuild()->set_per_unit_us(1);
      beat.mutable_speeds()->mutable_rebuild()->set_samples(4);
    }
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }
  // An unlimited link: every choice is predicted at 80 ms (the prefill holds each), so the
  // recommended point stands, as before speeds were known: nothing is clearly faster.
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kScd);
  ASSERT_TRUE(route->targets[0].point.has_value());
  EXPECT_EQ(route->targets[0].point->code_dtype, WireDtype::kInt8);
  EXPECT_DOUBLE_EQ(route->targets[0].predicted_ttft_us, 80000);
  EXPECT_THAT(route->targets[0].mode_reason,
              HasSubstr("kept: nothing within the recommended point's KL 0.02 is predicted "
                        "faster by 1 ms and 5 %"));
  EXPECT_THAT(route->targets[0].mode_reason,
              HasSubstr("runner-up local prefill predicted 80.0 ms"));
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("taken as unlimited"));
  // No limited link known: nothing to adapt to (a late transfer would be the nodes' compute).
  EXPECT_EQ(route->targets[0].deliver_by_us, 0);
  EXPECT_EQ(route->targets[0].planned_goodput_bytes_per_s, 0);
  // With a TTFT objective of 100 ms every choice meets it: the best quality, local prefill.
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint, 0, 100);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("meet ttft_slo_ms 100"));
  // A slow link set through SetLinkShape (0.0001 Gbit/s = 12.5 kB/s): 3999 x 40 B take 12.8 s.
  v1::LinkShape shape;
  shape.set_gbps(0.0001);
  registry_.NoteLinkShape(producer, shape);
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("0.0001 Gbit/s as shaped"));
  // A finished transfer that travelled unshaped clears the shape; one the link held back
  // (transfer far beyond the prefill) is then the link's measure.
  v1::Finished finished;
  SetRanMode(*ParseTransferMode("scd"), &finished);
  finished.set_payload_bytes(8000);
  finished.mutable_timings()->set_prefill(4000);
  finished.mutable_timings()->set_transfer(800'000);  // 10 kB/s
  RouteTarget target;
  target.consumer_node = consumer;
  registry_.ObserveFinished(*route, target, finished);  // a local route: no producer, no link
  Route with_producer;
  with_producer.producer_node = producer;
  // Routed before the shape was set: its Finished tells nothing of the link now.
  with_producer.routed_at = route->routed_at - absl::Seconds(1);
  registry_.ObserveFinished(with_producer, target, finished);
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("0.0001 Gbit/s as shaped"));
  with_producer.routed_at = route->routed_at;
  registry_.ObserveFinished(with_producer, target, finished);
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("8e-05 Gbit/s as measured"));
  // A report that cannot be a cost (NaN, negative) counts as not measured: no prediction from it.
  for (const std::string& id : {producer, consumer}) {
    v1::HeartbeatRequest broken;
    broken.set_node_id(id);
    broken.mutable_speeds()->mutable_prefill()->set_per_unit_us(std::nan(""));
    broken.mutable_speeds()->mutable_prefill()->set_samples(4);
    broken.mutable_speeds()->mutable_rebuild()->set_fixed_us(-5);
    broken.mutable_speeds()->mutable_rebuild()->set_samples(4);
    ASSERT_TRUE(registry_.Heartbeat(broken).ok());
  }
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].predicted_ttft_us, 0);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("the recommended one"));
  // A budget no point meets leaves local alone; explicit modes predict nothing.
  route = ResolveNamed(registry_, {"fables"}, "auto", &hint, 0.001);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  route = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].predicted_ttft_us, 0);
}

// Local prefills routed to a consumer and not yet at their first token share its compute: the
// next local prefill there waits behind them, so auto sends codes instead; once they produced
// their first tokens (or ended) local prefill is as fast as before.
TEST_F(NodeRegistryTest, LocalPrefillsStillRunningOnAConsumerQueueTheNextOne) {
  const std::string producer = Add(Producer("base", kBaseFp));
  const std::string consumer = AddFablesWithFrontier();
  // The consumer prefills at 10 us per token, the producer at 15: local is the faster when idle.
  BeatSpeed(producer, 15);
  BeatSpeed(consumer, 10);
  PrefixHint hint;
  hint.prompt_tokens = 4000;
  // The next auto route: its mode and predicted TTFT checked.
  auto next = [&](const std::string& mode, double predicted_us) {
    absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
    EXPECT_TRUE(route.ok()) << route.status();
    if (!route.ok()) return Route{};
    EXPECT_EQ(TransferModeName(route->targets[0].mode), mode);
    EXPECT_DOUBLE_EQ(route->targets[0].predicted_ttft_us, predicted_us);
    return *std::move(route);
  };
  const Route first = next("local", 40000);
  registry_.NoteRouted(first, &hint);
  // One local prefill running there: 40 ms queued + 40 ms; the codes 60 ms.
  const Route second = next("scd", 60000);
  EXPECT_NE(second.id, first.id);
  // Its first token came (it may still be decoding): local again, at 40 ms.
  registry_.NoteFirstToken(first, 0);
  const Route third = next("local", 40000);
  // A route that ends before its first token leaves no prefill behind either.
  registry_.NoteRouted(third, &hint);
  registry_.RoutedDone(third);
  const Route fourth = next("local", 40000);
  // The producer's side: a transfer whose first token has not come queues the next one there
  // (60 ms + 60 ms against local's 40 + 40 behind the fourth); once it came the transfer is
  // decoding on the consumer and no longer holds the producer, though the route lives on.
  registry_.NoteRouted(second, &hint);
  registry_.NoteRouted(fourth, &hint);
  const Route fifth = next("local", 80000);
  EXPECT_THAT(fifth.targets[0].mode_reason, HasSubstr("120.0 ms"));
  registry_.NoteFirstToken(second, 0);
  const Route sixth = next("scd", 60000);
  // The producer's own word bounds it: routed again (one ahead), then a heartbeat saying no
  // prefill runs there (the transfer waits on the consumer's side): nothing ahead.
  registry_.NoteRouted(sixth, &hint);
  const Route seventh = next("local", 80000);
  EXPECT_THAT(seventh.targets[0].mode_reason, HasSubstr("120.0 ms"));
  BeatSpeed(producer, 15, /*active=*/0);
  next("scd", 60000);
}

// A link shape learnt from a transfer's Finished (the coordinator announced none, as under
// `scd-bench sweep --trace-unannounced`) stands for learnt_link_max_age: the local prefills it
// sends auto to carry no word of the link, so auto weighs the codes again once it is old. One
// the coordinator announced stays.
TEST_F(NodeRegistryTest, ALearntLinkShapeIsForgottenAnAnnouncedOneStays) {
  const std::string producer = Add(Producer("base", kBaseFp));
  const std::string consumer = AddFablesWithFrontier();
  // Heartbeats with speeds (the consumer prefills at 20 us per token, the producer at 10), and
  // time passing in steps within the lease.
  auto beat = [&] {
    BeatSpeed(producer, 10);
    BeatSpeed(consumer, 20);
  };
  auto pass = [&](absl::Duration d) {
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Seconds(1));
      clock_.Advance(step);
      d -= step;
      beat();
    }
  };
  beat();
  PrefixHint hint;
  hint.prompt_tokens = 4000;
  // The next auto route's mode, and a phrase of its reason.
  auto expect = [&](const std::string& mode, const std::string& reason) {
    absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "auto", &hint);
    ASSERT_TRUE(route.ok()) << route.status();
    EXPECT_EQ(TransferModeName(route->targets[0].mode), mode) << route->targets[0].mode_reason;
    EXPECT_THAT(route->targets[0].mode_reason, HasSubstr(reason));
  };
  expect("scd", "taken as unlimited");
  // The codes travelled under 0.0001 Gbit/s (the link did not hold the pass back for long
  // enough to be measured): learnt, auto prefills locally.
  Route with_producer;
  with_producer.producer_node = producer;
  with_producer.routed_at = clock_.Now();
  v1::Finished finished;
  SetRanMode(*ParseTransferMode("scd"), &finished);
  finished.mutable_link()->set_gbps(0.0001);
  RouteTarget target;
  target.consumer_node = consumer;
  registry_.ObserveFinished(with_producer, target, finished);
  expect("local", "0.0001 Gbit/s as shaped");
  pass(registry_.options().learnt_link_max_age);
  expect("local", "0.0001 Gbit/s as shaped");  // forgotten only after the age
  pass(absl::Milliseconds(1));
  expect("scd", "taken as unlimited");
  // Announced through SetLinkShape: it stays however old.
  v1::LinkShape shape;
  shape.set_gbps(0.0001);
  registry_.NoteLinkShape(producer, shape);
  pass(registry_.options().learnt_link_max_age * 3);
  expect("local", "0.0001 Gbit/s as shaped");
}

TEST_F(NodeRegistryTest, FrontierPointsChosenByTheQualityBudget) {
  Add(Producer("base", kBaseFp));
  v1::RegisterRequest consumer = Consumer("fables", kFablesFp, {kBaseFp});
  AddFrontier(consumer.mutable_artifacts(0));
  Add(consumer);
  // auto without speeds cannot weigh a TTFT objective: it says so.
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "auto", nullptr, 0, 500);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_THAT(route->targets[0].mode_reason,
              HasSubstr("ttft_slo_ms 500 not weighed: no node's prefill speed is measured yet"));
  // auto without a budget: the recommended point, said in the reason.
  route = ResolveNamed(registry_, {"fables"}, "auto");
  ASSERT_TRUE(route.ok()) << route.status();
  const RouteTarget& t = route->targets[0];
  EXPECT_EQ(t.mode, TransferMode::kScd);
  ASSERT_TRUE(t.point.has_value());
  EXPECT_EQ(t.point->code_dtype, WireDtype::kInt8);
  EXPECT_EQ(t.point->rank_k, (std::vector<int64_t>{4, 4}));
  EXPECT_DOUBLE_EQ(t.point->kl, 0.02);
  EXPECT_THAT(t.mode_reason,
              HasSubstr("frontier point #1 int8 K 4,4 V 4,4 (KL 0.02, 40.0 B/token)"));
  EXPECT_THAT(t.mode_reason, HasSubstr("the recommended one"));
  // auto with a budget: the cheapest point within it.
  route = ResolveNamed(registry_, {"fables"}, "", nullptr, 0.06);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->targets[0].point->code_dtype, WireDtype::kInt4);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("the cheapest within max_kl 0.06"));
  route = ResolveNamed(registry_, {"fables"}, "auto", nullptr, 0.019);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].point->code_dtype, WireDtype::kF16);
  // No point within it: auto prefills locally (KL 0) and says why, naming the best point.
  route = ResolveNamed(registry_, {"fables"}, "auto", nullptr, 0.001);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_FALSE(route->targets[0].point.has_value());
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("within max_kl 0.001"));
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("#2 f16"));
  // Explicit scd: the fitted configuration without a budget (no point sent), the cheapest
  // within one, FAILED_PRECONDITION naming the field when none is.
  route = ResolveNamed(registry_, {"fables"}, "scd");
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kScd);
  EXPECT_FALSE(route->targets[0].point.has_value());
  route = ResolveNamed(registry_, {"fables"}, "scd", nullptr, 0.03);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].point->code_dtype, WireDtype::kInt8);
  absl::Status status = ResolveNamed(registry_, {"fables"}, "scd", nullptr, 0.001).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("max_kl: no point"));
  EXPECT_THAT(status.message(), HasSubstr("mode auto to prefill locally"));

  // An artifact without a frontier: a budget cannot be checked, so auto goes local and explicit
  // scd is refused; without a budget, scd at the fitted configuration as before.
  Add(Consumer("xs", kXsFp, {kBaseFp}, "10.0.0.3:7001"));
  route = ResolveNamed(registry_, {"xs"}, "auto", nullptr, 0.05);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("has no frontier"));
  EXPECT_EQ(ResolveNamed(registry_, {"xs"}, "scd", nullptr, 0.05).status().code(),
            absl::StatusCode::kFailedPrecondition);
  route = ResolveNamed(registry_, {"xs"}, "auto");
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kScd);
  EXPECT_FALSE(route->targets[0].point.has_value());
}

TEST_F(NodeRegistryTest, RegistrationWithABrokenFrontierIsRefused) {
  v1::RegisterRequest consumer = Consumer("fables", kFablesFp, {kBaseFp});
  AddFrontier(consumer.mutable_artifacts(0));
  v1::RegisterRequest unordered = consumer;
  unordered.mutable_artifacts(0)->mutable_frontier(0)->set_bytes_per_token(1000);
  absl::Status status = registry_.Register(unordered).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("ascending"));
  v1::RegisterRequest dtype = consumer;
  dtype.mutable_artifacts(0)->mutable_frontier(1)->mutable_point()->set_code_dtype("int3");
  EXPECT_THAT(registry_.Register(dtype).status().message(), HasSubstr("int3"));
  v1::RegisterRequest recommended = consumer;
  recommended.mutable_artifacts(0)->set_recommended(3);
  EXPECT_THAT(registry_.Register(recommended).status().message(),
              HasSubstr("recommends point 3 of 3"));
  v1::RegisterRequest nan = consumer;
  nan.mutable_artifacts(0)->mutable_frontier(2)->set_kl(std::nan(""));
  EXPECT_EQ(registry_.Register(nan).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NodeRegistryTest, ExplicitModesNeedWhatTheyNeed) {
  Add(Producer("base", kBaseFp));
  Add(Consumer("xs", kXsFp, {}));
  // scd/reuse need an artifact for the pair: refused, naming what the consumer holds.
  absl::Status status = ResolveNamed(registry_, {"xs"}, "scd").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("base -> xs"));
  EXPECT_THAT(status.message(), HasSubstr("holds none"));
  EXPECT_EQ(ResolveNamed(registry_, {"xs"}, "reuse").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // So does recompute: its layer list comes from the pair's artifact (a request has none).
  EXPECT_EQ(ResolveNamed(registry_, {"xs"}, "recompute").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // raw/int4/local need none; raw and int4 across different weights say the quality is degraded
  // (served as asked: the benchmark's baselines).
  for (const char* mode : {"raw", "int4", "local"}) {
    absl::StatusOr<Route> route = ResolveNamed(registry_, {"xs"}, mode);
    ASSERT_TRUE(route.ok()) << mode << ": " << route.status();
    EXPECT_EQ(TransferModeName(route->targets[0].mode), mode);
    EXPECT_EQ(route->producer_name.empty(), std::string(mode) == "local") << mode;
    const bool degraded = std::string(mode) == "raw" || std::string(mode) == "int4";
    EXPECT_EQ(route->targets[0].mode_reason.find("quality degraded") != std::string::npos, degraded)
        << mode << ": " << route->targets[0].mode_reason;
  }
}

TEST_F(NodeRegistryTest, StrictModesRefuseCachesAcrossDifferentWeights) {
  NodeRegistry strict(RegistryOptions{absl::Seconds(2), absl::Milliseconds(500),
                                      absl::Milliseconds(100), /*strict_modes=*/true},
                      &clock_);
  ASSERT_TRUE(strict.Register(Producer("base", kBaseFp)).ok());
  ASSERT_TRUE(strict.Register(Consumer("fables", kFablesFp, {kBaseFp})).ok());
  ASSERT_TRUE(strict.Register(Consumer("base-copy", kBaseFp, {})).ok());
  for (const char* mode : {"raw", "int4", "reuse"}) {
    absl::Status status = ResolveNamed(strict, {"fables"}, mode).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(status.message(), HasSubstr("weights differ")) << mode;
    // Identical weights stay faithful: served, reason "requested".
    absl::StatusOr<Route> same =
        ResolveNamed(strict, {"base-copy"}, mode == std::string("reuse") ? "raw" : mode);
    ASSERT_TRUE(same.ok()) << mode << ": " << same.status();
    EXPECT_EQ(same->targets[0].mode_reason, "requested");
  }
  EXPECT_TRUE(ResolveNamed(strict, {"fables"}, "scd").ok());
  EXPECT_TRUE(ResolveNamed(strict, {"fables"}, "recompute").ok());
}

// A coordinator that tokenizes prompts sends ids: a node whose tokenizer differs would read them
// as other tokens, so it is refused at registration (etcd's Upsert too); a node without a
// tokenizer (ids only) and a coordinator without one check nothing.
TEST_F(NodeRegistryTest, ANodeWhoseTokenizerIsNotTheCoordinatorsIsRefused) {
  RegistryOptions options;
  options.tokenizer_fingerprint = "1234567890abcdef-coordinator";
  NodeRegistry registry(options, &clock_);
  v1::RegisterRequest other = Consumer("fables", kFablesFp, {});
  other.set_tokenizer_fingerprint("fedcba0987654321-other");
  absl::StatusOr<Lease> refused = registry.Register(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("fedcba098765"));
  EXPECT_THAT(refused.status().message(), HasSubstr("1234567890ab"));
  EXPECT_EQ(registry.Upsert("consumer-etcd", other, {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.size(), 0u);
  v1::RegisterRequest same = other;
  same.set_tokenizer_fingerprint(options.tokenizer_fingerprint);
  EXPECT_TRUE(registry.Register(same).ok());
  v1::RegisterRequest ids_only = Producer("base", kBaseFp);
  EXPECT_TRUE(registry.Register(ids_only).ok());
  EXPECT_TRUE(registry_.Register(other).ok()) << "a coordinator without a tokenizer checks nothing";
}

TEST_F(NodeRegistryTest, NodeIdsAreRandomAndUnguessable) {
  const std::string a = Add(Consumer("fables", kFablesFp, {}));
  const std::string b = Add(Consumer("fables", kFablesFp, {}));
  ASSERT_EQ(a.rfind("consumer-", 0), 0u);
  EXPECT_EQ(a.size(), std::string("consumer-").size() + 32);
  EXPECT_NE(a, b);
  // The sequential ids of before (consumer-1, consumer-2, ...) name nothing.
  for (const char* guess : {"consumer-1", "consumer-2", "producer-1", "producer-3"}) {
    EXPECT_EQ(registry_.Deregister(guess).code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(registry_.size(), 2u);
}

TEST_F(NodeRegistryTest, WithoutProducerAutoRunsLocalAndCodeModesAreUnavailable) {
  Add(Consumer("fables", kFablesFp, {kBaseFp}));
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "auto");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_TRUE(route->producer_node.empty());
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(route->targets[0].mode_reason, HasSubstr("no live producer"));
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "raw").status().code(),
            absl::StatusCode::kUnavailable);
  // A request that allows its fallback (the default) prefills locally instead, saying why.
  absl::StatusOr<Route> fallback = registry_.Resolve({"fables"}, RequestedMode(TransferMode::kRaw),
                                                     nullptr, 0, 0, /*local_fallback=*/true);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_TRUE(fallback->producer_node.empty());
  EXPECT_EQ(fallback->targets[0].mode, TransferMode::kLocal);
  EXPECT_THAT(fallback->targets[0].mode_reason, HasSubstr("fallback: no live producer"));
}

TEST_F(NodeRegistryTest, FanOutSharesTheProducerThatServesMostTargets) {
  // Two producers; only "base" has artifacts at both consumers: the fan-out goes to it even
  // though the other is less loaded.
  const std::string base = Add(Producer("base", kBaseFp, "10.0.0.1:7000"));
  const std::string other = Add(Producer("other", kXsFp, "10.0.0.9:7000"));
  Beat(base, 5);
  Beat(other, 0);
  Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  Add(Consumer("xs", kXsFp, {kBaseFp}, "10.0.0.3:7001"));
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables", "xs"}, "auto");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->producer_node, base);
  std::vector<std::string> modes;
  for (const RouteTarget& target : route->targets) modes.push_back(TransferModeName(target.mode));
  EXPECT_THAT(modes, ElementsAre("scd", "scd"));
  // Explicit raw needs nothing: the least loaded producer wins.
  route = ResolveNamed(registry_, {"fables", "xs"}, "raw");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->producer_node, other);
  // Explicit scd: only "base" can serve both.
  route = ResolveNamed(registry_, {"fables", "xs"}, "scd");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->producer_node, base);
}

TEST_F(NodeRegistryTest, LeastLoadedConsumerServesTheTarget) {
  Add(Producer("base", kBaseFp));
  const std::string busy = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  const std::string idle = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001"));
  Beat(busy, 3);
  Beat(idle, 1);
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->targets[0].consumer_node, idle);
  Beat(idle, 7);
  route = ResolveNamed(registry_, {"fables"}, "");
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->targets[0].consumer_node, busy);
}

// A moved stream's replica (ResolveMove): a live consumer of the target with the same weights,
// none given up, least loaded first, local prefill and no producer; UNAVAILABLE when none is left.
TEST_F(NodeRegistryTest, AMovedStreamGoesToAnotherReplicaWithTheSameWeights) {
  Add(Producer("base", kBaseFp));
  const std::string dead = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  const std::string busy = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001"));
  const std::string idle = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.6:7001"));
  Add(Consumer("fables", "dddd0000otherweights", {}, "10.0.0.7:7001"));  // same name, not weights
  Beat(busy, 3);
  MoveConstraint move{{dead}, kFablesFp};
  absl::StatusOr<Route> route = registry_.ResolveMove("fables", move);
  ASSERT_TRUE(route.ok()) << route.status();
  ASSERT_EQ(route->targets.size(), 1u);
  EXPECT_EQ(route->targets[0].consumer_node, idle);
  EXPECT_EQ(route->targets[0].mode, TransferMode::kLocal);
  EXPECT_EQ(route->targets[0].consumer_fingerprint, kFablesFp);
  EXPECT_TRUE(route->producer_node.empty());
  move.exclude_nodes.insert(idle);
  route = registry_.ResolveMove("fables", move);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->targets[0].consumer_node, busy);
  move.exclude_nodes.insert(busy);
  route = registry_.ResolveMove("fables", move);
  EXPECT_TRUE(absl::IsUnavailable(route.status())) << route.status();
  EXPECT_THAT(route.status().message(), HasSubstr("no other live replica"));
}

// Fast ejection through the registry: a node whose call failed is out of routing at once (no
// lease has lapsed), its probes are handed out one at a time, kProbeInterval apart, and it is
// routed to again right after kProbesToReturn probes passed in a row.
TEST_F(NodeRegistryTest, ANodeWhoseCallFailedIsOutUntilItsProbesPass) {
  Add(Producer("base", kBaseFp));
  const std::string a = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  const std::string b = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001"));
  Beat(b, 5);  // busier: routing picks `a` while it is in
  auto routed_to = [&] {
    absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "local");
    EXPECT_TRUE(route.ok()) << route.status();
    return route.ok() ? route->targets[0].consumer_node : "";
  };
  EXPECT_EQ(routed_to(), a);
  EXPECT_TRUE(registry_.TakeDueProbes().empty());
  auto listed = [&] {  // the consumers ListModels shows
    int n = 0;
    for (const v1::ModelInfo& m : registry_.Models()) n += m.name() == "fables";
    return n;
  };
  EXPECT_EQ(listed(), 2);
  registry_.NoteUnreachable(a, "connection refused");
  EXPECT_TRUE(registry_.Ejected(a));
  EXPECT_EQ(routed_to(), b) << "out at once, not when its lease lapses";
  EXPECT_EQ(listed(), 1) << "ListModels shows what is routed to";
  std::vector<NodeRegistry::DueProbe> due = registry_.TakeDueProbes();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].node_id, a);
  EXPECT_EQ(due[0].address, "10.0.0.2:7001");
  EXPECT_EQ(due[0].role, v1::NODE_ROLE_CONSUMER);
  EXPECT_TRUE(registry_.TakeDueProbes().empty()) << "one probe at a time";
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    registry_.NoteProbe(a, true);
    EXPECT_TRUE(registry_.Ejected(a));
    EXPECT_TRUE(registry_.TakeDueProbes().empty()) << "the next one kProbeInterval later";
    clock_.Advance(kProbeInterval);
    ASSERT_EQ(registry_.TakeDueProbes().size(), 1u);
  }
  registry_.NoteProbe(a, true);
  EXPECT_FALSE(registry_.Ejected(a));
  EXPECT_EQ(routed_to(), a);
  EXPECT_EQ(listed(), 2);
  EXPECT_EQ(registry_.ejection_counts().ejected, 1u);
  EXPECT_EQ(registry_.ejection_counts().returned, 1u);
  // Both out: the target is unavailable, as with no live consumer.
  registry_.NoteUnreachable(a, "reset");
  registry_.NoteUnreachable(b, "reset");
  absl::StatusOr<Route> none = ResolveNamed(registry_, {"fables"}, "local");
  EXPECT_TRUE(absl::IsUnavailable(none.status())) << none.status();
  registry_.NoteUnreachable("consumer-unknown", "ignored");  // a node gone meanwhile: nothing
  registry_.NoteUnreachable(a, "again");                     // out already: not counted again
  EXPECT_EQ(registry_.ejection_counts().ejected, 3u);
  EXPECT_EQ(registry_.ejection_counts().advice_heard, 0u);
}

// Advice from another coordinator: the node stays routed while its own probe (due at once) is
// under way; a pass clears it, a failure ejects it here too. Only this coordinator's own
// ejections reach the listener (they are what it tells the others), each once.
TEST_F(NodeRegistryTest, AdviceIsConfirmedByThisCoordinatorsOwnProbe) {
  Add(Producer("base", kBaseFp));
  const std::string a = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  const std::string b = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001"));
  Beat(b, 5);  // busier: routing picks `a` while it is in
  std::vector<std::pair<std::string, std::string>> told;
  registry_.SetEjectionListener(
      [&](const std::string& node, const std::string& why) { told.emplace_back(node, why); });
  auto routed_to = [&] {
    absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "local");
    EXPECT_TRUE(route.ok()) << route.status();
    return route.ok() ? route->targets[0].consumer_node : "";
  };
  registry_.NoteAdvice(a, "coordinator-x", "keepalive watchdog timeout");
  EXPECT_FALSE(registry_.Ejected(a)) << "advice alone ejects nothing";
  EXPECT_EQ(routed_to(), a) << "a suspect node is still routed";
  std::vector<NodeRegistry::DueProbe> due = registry_.TakeDueProbes();
  ASSERT_EQ(due.size(), 1u) << "its probe is due at once";
  EXPECT_EQ(due[0].node_id, a);
  registry_.NoteAdvice(a, "coordinator-y", "again");  // suspect already: nothing more
  EXPECT_TRUE(registry_.TakeDueProbes().empty());
  registry_.NoteProbe(a, true);
  EXPECT_FALSE(registry_.Ejected(a));
  EXPECT_EQ(routed_to(), a);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(registry_.TakeDueProbes().empty()) << "cleared: trusted again, not probed";
  EXPECT_TRUE(told.empty()) << "nothing ejected here";

  registry_.NoteAdvice(a, "coordinator-x", "reset");
  ASSERT_EQ(registry_.TakeDueProbes().size(), 1u);
  registry_.NoteProbe(a, false);
  EXPECT_TRUE(registry_.Ejected(a)) << "its own probe failed too";
  EXPECT_EQ(routed_to(), b);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].first, a);
  EXPECT_EQ(registry_.ejection_counts().advice_heard, 2u);
  EXPECT_EQ(registry_.ejection_counts().advice_cleared, 1u);
  EXPECT_EQ(registry_.ejection_counts().advice_confirmed, 1u);
  EXPECT_EQ(registry_.ejection_counts().ejected, 1u) << "a confirmed suspect is out on its probe";

  registry_.NoteUnreachable(b, "connection refused");
  registry_.NoteUnreachable(b, "refused again");  // out already: not told twice
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1], std::make_pair(b, std::string("connection refused")));
  registry_.NoteAdvice("consumer-unknown", "coordinator-x", "ignored");
  EXPECT_EQ(registry_.ejection_counts().advice_heard, 2u);
  registry_.SetEjectionListener(nullptr);
}

// Consumers that report KV memory are routed on the bytes they have free, not on request counts:
// a consumer running fewer but larger requests is the busier one; one whose free bytes cannot hold
// the request is taken only when every candidate is full (it then queues the request); requests
// routed since the last heartbeat count with their bytes until they are done.
TEST_F(NodeRegistryTest, ConsumersAreRoutedOnTheirFreeKvBytes) {
  Add(Producer("base", kBaseFp));
  v1::RegisterRequest a = Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001");
  v1::RegisterRequest b = Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001");
  for (v1::RegisterRequest* r : {&a, &b}) {
    r->set_capacity(16);
    r->set_kv_budget_bytes(1'000'000);
    r->set_kv_bytes_per_token(1'000);
  }
  const std::string few_large = Add(a), many_small = Add(b);
  auto beat = [&](const std::string& id, uint32_t active, uint64_t reserved, uint64_t queued) {
    v1::HeartbeatRequest state;
    state.set_node_id(id);
    state.set_active_requests(active);
    state.set_kv_reserved_bytes(reserved);
    state.set_kv_queued_bytes(queued);
    ASSERT_TRUE(registry_.Heartbeat(state).ok());
  };
  beat(few_large, 2, 800'000, 0);   // 2 requests, 80 % of its memory
  beat(many_small, 6, 300'000, 0);  // 6 requests, 30 %
  PrefixHint hint;
  hint.kv_positions = 100;  // 100,000 bytes
  absl::StatusOr<Route> route = ResolveNamed(registry_, {"fables"}, "", &hint);
  ASSERT_TRUE(route.ok()) << route.status();
  EXPECT_EQ(route->targets[0].consumer_node, many_small);
  EXPECT_EQ(route->targets[0].kv_bytes, 100'000);
  // Routed and not yet reported: their bytes count. Nine such requests fill many_small past
  // few_large's 80 %; done, they count no more.
  const Route routed = *route;
  for (int i = 0; i < 9; ++i) registry_.NoteRouted(routed, &hint);
  route = ResolveNamed(registry_, {"fables"}, "", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].consumer_node, few_large);
  for (int i = 0; i < 9; ++i) registry_.RoutedDone(routed);
  route = ResolveNamed(registry_, {"fables"}, "", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].consumer_node, many_small);
  // Neither has room for a 300,000-byte request once both are nearly full: the one with more
  // free bytes takes it (and queues it); with room on one, that one, whatever its load.
  beat(few_large, 2, 800'000, 0);
  beat(many_small, 6, 900'000, 50'000);
  hint.kv_positions = 300;
  route = ResolveNamed(registry_, {"fables"}, "", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].consumer_node, few_large);
  beat(few_large, 2, 800'000, 100'000);  // queued bytes count as used
  beat(many_small, 1, 600'000, 0);
  route = ResolveNamed(registry_, {"fables"}, "", &hint);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(route->targets[0].consumer_node, many_small);
}

// Cache-aware routing: the prompt's prefix blocks (routing keys) against what nodes report.
PrefixHint Hint(int blocks, uint64_t first = 100) {
  PrefixHint hint;
  hint.block_tokens = 16;
  for (int i = 0; i < blocks; ++i) hint.blocks.push_back(first + static_cast<uint64_t>(i));
  return hint;
}

TEST_F(NodeRegistryTest, ASecondRequestWithTheSamePrefixGoesToTheProducerHoldingIt) {
  v1::RegisterRequest first_producer = Producer("base", kBaseFp, "10.0.0.1:7000");
  first_producer.set_capacity(2);
  const std::string a = Add(first_producer);
  const std::string b = Add(Producer("base", kBaseFp, "10.0.0.9:7000"));
  Add(Consumer("fables", kFablesFp, {kBaseFp}));
  const PrefixHint hint = Hint(8);
  // Both report an empty prefix cache (a node that reports none gets no predictions).
  for (const std::string& id : {a, b}) {
    v1::HeartbeatRequest empty;
    empty.set_node_id(id);
    empty.mutable_prefix_blocks()->set_block_tokens(16);
    ASSERT_TRUE(registry_.Heartbeat(empty).ok());
  }
  absl::StatusOr<Route> first = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->producer_cached_tokens, 0u);
  const std::string holder = first->producer_node;
  const std::string other = holder == a ? b : a;
  registry_.NoteRouted(*first, &hint);  // still running: load 1 on the holder
  // The holder's match (8 blocks) outweighs its one active request.
  absl::StatusOr<Route> second = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->producer_node, holder);
  EXPECT_EQ(second->producer_cached_tokens, 128u);
  // A prompt sharing nothing goes to the idle producer.
  const PrefixHint unrelated = Hint(8, 900);
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd", &unrelated)->producer_node, other);
  registry_.RoutedDone(*first);

  // Reports replace predictions: the holder says it evicted everything, the other holds it.
  v1::HeartbeatRequest beat;
  beat.set_node_id(holder);
  beat.mutable_prefix_blocks()->set_block_tokens(16);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  beat.set_node_id(other);
  for (uint64_t key : Hint(5).blocks) beat.mutable_prefix_blocks()->add_blocks(key);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  second = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  EXPECT_EQ(second->producer_node, other);
  EXPECT_EQ(second->producer_cached_tokens, 80u);  // the leading 5 blocks

  // Unless the holder is at capacity: producer `a` holds the prefix and runs 2 of its 2.
  beat.set_node_id(a);
  beat.set_active_requests(2);
  for (uint64_t key : hint.blocks) beat.mutable_prefix_blocks()->add_blocks(key);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  beat.set_node_id(b);
  beat.set_active_requests(0);
  beat.mutable_prefix_blocks()->clear_blocks();
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd", &hint)->producer_node, b);
  beat.set_node_id(a);
  beat.set_active_requests(1);
  for (uint64_t key : hint.blocks) beat.mutable_prefix_blocks()->add_blocks(key);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd", &hint)->producer_node, a);
}

TEST_F(NodeRegistryTest, NoPredictionsForANodeWithoutAPrefixCache) {
  Add(Producer("base", kBaseFp, "10.0.0.1:7000"));
  Add(Producer("base", kBaseFp, "10.0.0.9:7000"));
  Add(Consumer("fables", kFablesFp, {kBaseFp}));
  const PrefixHint hint = Hint(8);
  absl::StatusOr<Route> first = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  ASSERT_TRUE(first.ok());
  registry_.NoteRouted(*first, &hint);
  registry_.RoutedDone(*first);
  // Nothing was remembered for it: the second request sees no match anywhere.
  absl::StatusOr<Route> second = ResolveNamed(registry_, {"fables"}, "scd", &hint);
  EXPECT_EQ(second->producer_cached_tokens, 0u);
}

TEST_F(NodeRegistryTest, TheConsumerHoldingThePrefixServesTheTargetUnlessBusy) {
  Add(Producer("base", kBaseFp));
  const std::string warm = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.2:7001"));
  const std::string cold = Add(Consumer("fables", kFablesFp, {kBaseFp}, "10.0.0.5:7001"));
  const PrefixHint hint = Hint(8);
  v1::HeartbeatRequest beat;
  beat.set_node_id(warm);
  beat.set_active_requests(1);
  for (uint64_t key : hint.blocks) beat.mutable_prefix_blocks()->add_blocks(key);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  Beat(cold, 0);
  // cost: warm 0 + 0.5 * 1 * 8 = 4, cold 8 + 0.
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd", &hint)->targets[0].consumer_node, warm);
  // Three active requests outweigh the match (0 + 12 > 8).
  beat.set_active_requests(3);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd", &hint)->targets[0].consumer_node, cold);
  // Without a hint: load alone.
  beat.set_active_requests(1);
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  EXPECT_EQ(ResolveNamed(registry_, {"fables"}, "scd")->targets[0].consumer_node, cold);
}

TEST_F(NodeRegistryTest, ModelsListsLiveModelsWithTheirArtifacts) {
  Add(Producer("base", kBaseFp));
  Add(Consumer("fables", kFablesFp, {kBaseFp}));
  std::vector<v1::ModelInfo> models = registry_.Models();
  ASSERT_EQ(models.size(), 2u);
  std::map<std::string, v1::ModelInfo> by_name;
  for (const auto& m : models) by_name[m.name()] = m;
  EXPECT_EQ(by_name["base"].role(), "producer");
  EXPECT_EQ(by_name["fables"].role(), "consumer");
  ASSERT_EQ(by_name["fables"].producers_size(), 1);
  EXPECT_EQ(by_name["fables"].producers(0), kBaseFp);
  clock_.Advance(registry_.options().lease + absl::Milliseconds(1));
  EXPECT_TRUE(registry_.Models().empty());
}

}  // namespace
}  // namespace scd::coordinator
