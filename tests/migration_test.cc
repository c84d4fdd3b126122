// A stream moves to a live replica when the consumer serving it dies (coordinator/routed_request.h,
// the move step), in one process with every hop real (tests/serving_stack.h): two replicas of a
// target, the one serving a request killed after its first tokens reached the client. The client's
// stream goes on with the tokens the unmoved stream gave (greedy, and seeded sampling at
// temperature 0.8, top-p 0.9: model/sampler.h keys each draw by position), with one Started, one
// Moved (tokens so far, from and to which node), one Finished counting every token once and the
// move; the killed replica is out of routing at once, so the next request is served by the
// other. A replica dead before the request's Started hands it to another the same way (the
// client sees one Started, no Moved). Without another replica, or with migration_limit 0, the
// stream ends in one Error as before. A frozen replica whose early Prefill the (dead) producer
// failed first still hands its request on, and so does a started replica lost after the producer
// failed its transfer, and one its producer lost without a fallback; a consumer lost after its last
// token but before its Finished leaves nothing to move: the coordinator finishes the stream itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "model/generator.h"
#include "proto/grpc_server.h"
#include "proto/registry_client.h"
#include "proto/wire_mode.h"
#include "serving/event_stream.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

constexpr char kTarget[] = "b";

// A consumer's side of one Decode call that a scripted node holds open: it ends once, by its
// node (EndOnce) or when gRPC cancels it (the server stopping), as a dying node's calls end.
class HeldStream final : public EventStream {
 public:
  HeldStream() : EventStream(/*capacity=*/1024, nullptr) {
    end_on_cancel_ = cancellation().OnCancel([this](const absl::Status& why) {
      EndOnce(grpc::Status(grpc::StatusCode::CANCELLED, std::string(why.message())));
    });
  }
  void EndOnce(grpc::Status status) {
    if (!ended_.exchange(true)) End(std::move(status));
  }

 private:
  std::atomic<bool> ended_{false};
  Cancellation::Registration end_on_cancel_;
};

// A consumer node that answers every Decode with its Started (local) and max_tokens token events
// and then holds the call open without its Finished, until its server stops: the window between a
// consumer's last token and its Finished, which a real consumer leaves open only by timing (the
// soak met it: a replica killed after its 29th token of 29), held open so the test can kill the
// node in it.
class SilentAfterLastToken final : public v1::Consumer::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateEvent>* Decode(grpc::CallbackServerContext* /*context*/,
                                                      const v1::DecodeRequest* request) override {
    auto* stream = new HeldStream();
    v1::GenerateEvent started;
    started.set_target(request->target());
    SetRanMode(TransferMode::kLocal, started.mutable_started());
    stream->Push(started);
    for (uint32_t i = 0; i < request->request().max_tokens(); ++i) {
      v1::GenerateEvent token;
      token.set_target(request->target());
      token.mutable_token()->add_ids(static_cast<int32_t>(100 + i));
      token.mutable_token()->set_text("x");
      stream->Push(token);
    }
    return stream;
  }
};

// A consumer node that answers a Decode with its Started in the mode asked and waits for codes
// that cannot come (its transfer address refuses the producer), and dies when the coordinator
// tells it the producer failed the transfer: its Decode calls end UNAVAILABLE, as a killed node's
// do. So the producer's failure reaches the coordinator before the node's call ends, the order
// the soak met with a killed replica.
class DiesWhenToldTransferFailed final : public v1::Consumer::CallbackService {
 public:
  ~DiesWhenToldTransferFailed() override {
    for (HeldStream* stream : streams_) stream->Release();  // its call ended with the server
  }

  grpc::ServerWriteReactor<v1::GenerateEvent>* Decode(grpc::CallbackServerContext* /*context*/,
                                                      const v1::DecodeRequest* request) override {
    auto* stream = new HeldStream();
    stream->Hold();  // until the node dies (or the test ends)
    v1::GenerateEvent started;
    started.set_target(request->target());
    SetRanMode(TargetModeOf(*request).value_or(TransferMode::kLocal), started.mutable_started());
    stream->Push(started);
    absl::MutexLock lock(&mu_);
    streams_.push_back(stream);
    return stream;
  }

  grpc::ServerUnaryReactor* TransferFailed(grpc::CallbackServerContext* context,
                                           const v1::TransferFailedRequest* /*request*/,
                                           v1::TransferFailedResponse* response) override {
    absl::MutexLock lock(&mu_);
    told_ = true;
    response->set_found(streams_.empty() ? v1::TransferFailedResponse::FOUND_NONE
                                         : v1::TransferFailedResponse::FOUND_WAITING);
    for (HeldStream* stream : streams_) {
      stream->EndOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node died"));
      stream->Release();
    }
    streams_.clear();
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  bool told() {
    absl::MutexLock lock(&mu_);
    return told_;
  }

 private:
  absl::Mutex mu_;
  std::vector<HeldStream*> streams_ ABSL_GUARDED_BY(mu_);
  bool told_ ABSL_GUARDED_BY(mu_) = false;
};

// A consumer node that answers a Decode with its Started in the mode asked and waits for codes
// that cannot come (its transfer address refuses the producer, which fails that target alone as
// UNAVAILABLE), then ends its call UNAVAILABLE 500 ms later: as a frozen node's call ends on the
// coordinator's keepalive after its producer's transfer session gave up on it (the soak met it
// with a replica frozen right after its request was routed there). The producer's failure,
// immediate (a refused connection fails at once), comes first.
class LostByItsProducer final : public v1::Consumer::CallbackService {
 public:
  ~LostByItsProducer() override {
    for (std::thread& t : enders_) t.join();
  }

  grpc::ServerWriteReactor<v1::GenerateEvent>* Decode(grpc::CallbackServerContext* /*context*/,
                                                      const v1::DecodeRequest* request) override {
    auto* stream = new HeldStream();
    stream->Hold();  // until it ends the call
    v1::GenerateEvent started;
    started.set_target(request->target());
    SetRanMode(TargetModeOf(*request).value_or(TransferMode::kLocal), started.mutable_started());
    stream->Push(started);
    absl::MutexLock lock(&mu_);
    enders_.emplace_back([stream] {
      // paces: the node's keepalive verdict comes after its producer's failure (the scenario)
      absl::SleepFor(absl::Milliseconds(500));
      stream->EndOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive watchdog timeout"));
      stream->Release();
    });
    return stream;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::thread> enders_ ABSL_GUARDED_BY(mu_);
};

class MigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("tinystories-4m"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("tinystories-4m") + "/tokenizer.json"));
  }

  // A stack with `replicas` consumers of tinystories-4m-b, each its own node serving kTarget.
  std::unique_ptr<testing::ServingStack> Stack(int replicas, bool proxied = false) {
    testing::ServingStack::Options options;
    options.consumers_behind_proxies = proxied;
    auto stack = std::make_unique<testing::ServingStack>(producer_.get(), tokenizer_.get(),
                                                         "tinystories-4m", options);
    for (int i = 0; i < replicas; ++i) {
      stack->AddConsumer(Replica(i),
                         testing::Ok(LlamaModel::Load(testing::ModelDir("tinystories-4m-b"), {})),
                         std::nullopt, kTarget);
    }
    stack->Start();
    return stack;
  }
  static std::string Replica(int i) { return "b-" + std::to_string(i); }
  // The replica the registry routes to while both are idle: between replicas of equal cost and
  // load it takes the first by node id (coordinator/route_choice.cc PickConsumer).
  static std::string RoutedFirst(testing::ServingStack& stack) {
    return stack.node_id(Replica(0)) < stack.node_id(Replica(1)) ? Replica(0) : Replica(1);
  }
  static std::string TheOther(const std::string& replica) {
    return replica == Replica(0) ? Replica(1) : Replica(0);
  }

  // 300 tokens at most, local prefill: long enough that the serving replica is still decoding
  // when the test kills it after the client's third token (the scheduler runs at nice 10, the
  // client's thread at 0).
  static v1::GenerateRequest Request(bool seeded) {
    v1::GenerateRequest request;
    request.add_targets(kTarget);
    SetRequestMode(RequestedMode(TransferMode::kLocal), &request);
    const std::vector<TokenId> prompt = testing::LoadGolden("tinystories-4m-b").prompts[1].ids;
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(300);
    if (seeded) {
      request.set_temperature(0.8f);
      request.set_top_p(0.9f);
      request.set_seed(20261201);
    }
    return request;
  }

  // Runs `request`, killing the replica that serves it once the client has `after` tokens;
  // returns the reply and, in *killed, that replica's name ("" when none served it).
  static testing::ServingReply RunKilling(testing::ServingStack& stack, int replicas,
                                          const v1::GenerateRequest& request, size_t after,
                                          std::string* killed) {
    size_t tokens = 0;
    return stack.Generate(request, [&](const v1::GenerateEvent& event) {
      if (event.has_token()) tokens += static_cast<size_t>(event.token().ids_size());
      if (!killed->empty() || tokens < after) return;
      for (int i = 0; i < replicas; ++i) {
        if (stack.consumer(Replica(i)).admission->active() == 0) continue;
        *killed = Replica(i);
        stack.KillConsumer(*killed);
        return;
      }
    });
  }

  // Runs `request` unmoved (one replica), then on two replicas killing the serving one after
  // the client's third token: the same tokens, one Started, one Moved, one Finished counting
  // every token and the move, in the mode the stream began in; the next request goes to the
  // live replica at once.
  void ExpectMovedLikeUnmoved(const v1::GenerateRequest& request) {
    testing::ServingReply unmoved = Stack(1)->Generate(request);
    ASSERT_TRUE(unmoved.status.ok()) << unmoved.status.error_message();
    const std::vector<TokenId>& reference = unmoved.ids[kTarget];
    ASSERT_GE(reference.size(), 50u) << "a short story: the kill could come after its end";
    const v1::Finished& unmoved_end = unmoved.events[kTarget].back().finished();

    auto stack = Stack(2);
    std::string killed;
    testing::ServingReply moved = RunKilling(*stack, 2, request, 3, &killed);
    ASSERT_FALSE(killed.empty());
    ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
    EXPECT_EQ(moved.ids[kTarget], reference);
    const std::vector<v1::GenerateEvent>& events = moved.events[kTarget];
    int started = 0, moves = 0;
    uint32_t so_far = 0;
    for (const v1::GenerateEvent& e : events) {
      started += e.has_started();
      if (!e.has_moved()) continue;
      ++moves;
      so_far = e.moved().tokens_so_far();
      EXPECT_GE(e.moved().tokens_so_far(), 3u);
      EXPECT_EQ(e.moved().from_node(), stack->node_id(killed));
      EXPECT_EQ(e.moved().to_node(), stack->node_id(TheOther(killed)));
      EXPECT_EQ(e.moved().moves(), 1u);
      EXPECT_FALSE(e.moved().reason().empty());
    }
    EXPECT_EQ(started, 1);
    EXPECT_EQ(moves, 1);
    ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
    const v1::Finished& f = events.back().finished();
    EXPECT_EQ(f.moves(), 1u);
    EXPECT_EQ(f.output_tokens(), reference.size());
    EXPECT_EQ(f.prompt_tokens(), static_cast<uint32_t>(request.prompt_ids_size()));
    EXPECT_EQ(f.reason(), unmoved_end.reason());
    EXPECT_EQ(RanModeName(f), RanModeName(unmoved_end));
    EXPECT_THAT(f.mode_reason(), HasSubstr("moved to this replica"));
    // A greedy stream's ids so far were checked by the new replica's prefill
    // (consumer/continuation_check.h): each its pick, up to a near-tie; exact (a parted id
    // would have been refused) where every replica prefilled locally.
    if (request.temperature() == 0) {
      ASSERT_TRUE(f.has_continuation());
      EXPECT_EQ(f.continuation().checked(), so_far);
      EXPECT_EQ(f.continuation().parted(), 0u) << "worst gap " << f.continuation().worst_gap();
      EXPECT_EQ(f.continuation().exact(), RanMode(f) == TransferMode::kLocal);
    } else {
      EXPECT_FALSE(f.has_continuation()) << "a sampled stream is not checked";
    }

    // The killed replica left routing with its failed call (coordinator/node_ejection.h; its
    // lease here lasts an hour): the next request goes to the live one at once.
    testing::ServingReply next = stack->Generate(request);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids[kTarget], reference);
    for (const v1::GenerateEvent& e : next.events[kTarget]) EXPECT_FALSE(e.has_moved());
  }

  // `reply` was served by `other` after `first` froze: the reference's tokens, one move, `first`
  // out of routing and `other` in.
  static void ExpectServedElsewhere(testing::ServingStack& stack, testing::ServingReply& reply,
                                    testing::ServingReply& reference, const std::string& first,
                                    const std::string& other) {
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    EXPECT_EQ(reply.ids[kTarget], reference.ids[kTarget]);
    const std::vector<v1::GenerateEvent>& events = reply.events[kTarget];
    ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
    EXPECT_EQ(events.back().finished().moves(), 1u);
    EXPECT_GT(stack.consumer(other).scheduler->stats().steps, 0);
    EXPECT_TRUE(stack.registry().Ejected(stack.node_id(first)));
    EXPECT_FALSE(stack.registry().Ejected(stack.node_id(other)));
  }

  // A raw request (16 tokens; `allow_local_fallback` as given) routed first to `scripted`, a
  // consumer node serving kTarget whose transfer address refuses the producer, then moved to the
  // one real replica: the unmoved tokens, one Started, no Error, one move, raw throughout, the
  // scripted node out of routing and the real one in.
  void ExpectAScriptedReplicaLosesItsStream(grpc::Service* scripted, bool allow_local_fallback) {
    v1::GenerateRequest request = Request(false);
    request.set_max_tokens(16);
    request.set_allow_local_fallback(allow_local_fallback);
    SetRequestMode(RequestedMode(TransferMode::kRaw), &request);
    auto stack = Stack(1);
    testing::ServingReply reference = stack->Generate(request);
    ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();

    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {scripted});
    ASSERT_TRUE(server.ok()) << server.status();
    v1::RegisterRequest node;
    SetNodeIdentity(v1::NODE_ROLE_CONSUMER, server->address, kTarget,
                    stack->consumer(Replica(0)).fingerprint, &node);
    node.set_transfer_address("127.0.0.1:1");  // refuses: the producer cannot reach the node
    // Routed first: between idle replicas of equal cost the lowest node id wins (route_choice.cc
    // PickConsumer), and "consumer" sorts before every registered id ("consumer-<random>").
    const std::string scripted_id = "consumer";
    ASSERT_LT(scripted_id, stack->node_id(Replica(0)));
    ASSERT_TRUE(stack->registry().Upsert(scripted_id, node, v1::HeartbeatRequest()).ok());

    testing::ServingReply reply = stack->Generate(request);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    EXPECT_EQ(reply.ids[kTarget], reference.ids[kTarget]);
    const std::vector<v1::GenerateEvent>& events = reply.events[kTarget];
    int started = 0;
    for (const v1::GenerateEvent& e : events) {
      started += e.has_started();
      EXPECT_FALSE(e.has_error()) << e.DebugString();
    }
    EXPECT_EQ(started, 1);
    ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
    EXPECT_EQ(events.back().finished().moves(), 1u);
    EXPECT_EQ(RanModeName(events.back().finished()), "raw");
    EXPECT_TRUE(stack->registry().Ejected(scripted_id));
    EXPECT_FALSE(stack->registry().Ejected(stack->node_id(Replica(0))));
  }

  std::unique_ptr<LlamaModel> producer_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(MigrationTest, AKilledReplicasStreamGoesOnElsewhereWithTheSameTokens) {
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    ExpectMovedLikeUnmoved(Request(seeded));
  }
}

// A stream that began from codes (raw: the producer's own cache, across weights) goes on from
// codes: the new replica rebuilds the prompt from a fresh Prefill as the first did and prefills
// the streamed tokens on top, so it gives the tokens the unmoved stream gave (local prefill of
// the prompt would give the consumer's own cache and other tokens).
TEST_F(MigrationTest, AStreamThatBeganFromCodesGoesOnFromCodes) {
  v1::GenerateRequest request = Request(false);
  SetRequestMode(RequestedMode(TransferMode::kRaw), &request);
  ExpectMovedLikeUnmoved(request);
}

TEST_F(MigrationTest, AReplicaGoneBeforeItsStartedIsReplacedByAnother) {
  const v1::GenerateRequest request = Request(false);
  testing::ServingReply unmoved = Stack(1)->Generate(request);
  ASSERT_TRUE(unmoved.status.ok()) << unmoved.status.error_message();

  auto stack = Stack(2);
  // The replica routed to first dies before the request, still in routing (its lease lasts an
  // hour here), so the request goes to it.
  const std::string first = RoutedFirst(*stack);
  const std::string other = TheOther(first);
  stack->KillConsumer(first);
  ASSERT_FALSE(stack->registry().Ejected(stack->node_id(first)));
  testing::ServingReply reply = stack->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(reply.ids[kTarget], unmoved.ids[kTarget]);
  const std::vector<v1::GenerateEvent>& events = reply.events[kTarget];
  int started = 0;
  for (const v1::GenerateEvent& e : events) {
    started += e.has_started();
    EXPECT_FALSE(e.has_moved()) << "the client had nothing to be told of: " << e.DebugString();
  }
  EXPECT_EQ(started, 1);
  ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
  EXPECT_EQ(events.back().finished().moves(), 1u);
  EXPECT_TRUE(stack->registry().Ejected(stack->node_id(first)));
  EXPECT_FALSE(stack->registry().Ejected(stack->node_id(other)));
}

// A replica that stops answering (a frozen process: its connection open and silent) fails the
// calls on it once the coordinator's keepalive pings go unanswered (coordinator/node_ejection.h:
// every 0.5 s, 1 s to answer): out of routing, and the request it held goes to the other replica.
TEST_F(MigrationTest, AFrozenReplicaIsOutOnItsKeepaliveAndItsRequestGoesElsewhere) {
  v1::GenerateRequest request = Request(false);
  request.set_max_tokens(16);
  auto stack = Stack(2, /*proxied=*/true);
  const std::string first = RoutedFirst(*stack);
  const std::string other = TheOther(first);
  // The coordinator's connection to `first` is up (through its proxy) before it freezes.
  testing::ServingReply warm = stack->Generate(request);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  ASSERT_GT(stack->consumer(first).scheduler->stats().steps, 0) << "not served by " << first;
  EXPECT_EQ(stack->consumer(other).scheduler->stats().steps, 0);

  stack->FreezeConsumer(first);
  const absl::Time frozen = absl::Now();
  testing::ServingReply reply = stack->Generate(request);
  const absl::Duration took = absl::Now() - frozen;
  ExpectServedElsewhere(*stack, reply, warm, first, other);
  // Shown, not judged (a real-time bound belongs to a latency test): ~1-1.5 s of keepalive.
  std::printf("a frozen replica's request was served elsewhere %s after the freeze\n",
              absl::FormatDuration(took).c_str());
}

// The producer dead and a replica frozen: the early Prefill fails first (UNAVAILABLE at once),
// then the frozen replica's Decode ends UNAVAILABLE on the keepalive (~1 s later), before any
// Started. The node is gone whatever the producer said (it could not reach the node either), so
// it leaves routing and the request goes to the other replica in local mode. The soak met this
// with a SIGSTOPped replica: the request was refused while the other replica was up, because a
// target the producer had failed neither moved nor ejected its node.
TEST_F(MigrationTest, AFrozenReplicaWhoseProducerFailedFirstStillHandsItsRequestOn) {
  v1::GenerateRequest request = Request(false);
  request.set_max_tokens(16);
  auto stack = Stack(2, /*proxied=*/true);
  const std::string first = RoutedFirst(*stack);
  const std::string other = TheOther(first);
  // Local: the reference the moved request must give, and `first`'s connection up (through its
  // proxy) before it freezes.
  testing::ServingReply warm = stack->Generate(request);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  ASSERT_GT(stack->consumer(first).scheduler->stats().steps, 0) << "not served by " << first;

  stack->KillProducer();
  stack->FreezeConsumer(first);
  SetRequestMode(RequestedMode(TransferMode::kRaw), &request);  // early prefill: one target
  testing::ServingReply reply = stack->Generate(request);
  ExpectServedElsewhere(*stack, reply, warm, first, other);
  ASSERT_FALSE(reply.events[kTarget].empty());
  EXPECT_EQ(RanModeName(reply.events[kTarget].back().finished()), "local");
  EXPECT_TRUE(stack->registry().Ejected(stack->node_id(""))) << "the producer's Prefill failed";
}

// A consumer lost after it streamed every token the request allows, before its Finished: a move
// would leave the new replica nothing to generate (it refuses such a continuation), so the
// coordinator writes the Finished itself (reason length, every token counted once, no move).
TEST_F(MigrationTest, AConsumerLostAfterItsLastTokenEndsTheStreamFinished) {
  auto stack = Stack(0);
  SilentAfterLastToken silent;
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&silent});
  ASSERT_TRUE(server.ok()) << server.status();
  v1::RegisterRequest node;
  SetNodeIdentity(v1::NODE_ROLE_CONSUMER, server->address, "silent", "fp-silent", &node);
  node.set_transfer_address("127.0.0.1:1");  // never dialled: the request is local
  absl::StatusOr<coordinator::Lease> lease = stack->registry().Register(node);
  ASSERT_TRUE(lease.ok()) << lease.status();

  v1::GenerateRequest request = Request(false);
  request.set_targets(0, "silent");
  request.set_max_tokens(12);
  size_t tokens = 0;
  testing::ServingReply reply = stack->Generate(request, [&](const v1::GenerateEvent& event) {
    if (event.has_token()) tokens += static_cast<size_t>(event.token().ids_size());
    if (tokens == 12 && event.has_token()) server->Shutdown(absl::Now());  // the node dies
  });
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const std::vector<v1::GenerateEvent>& events = reply.events["silent"];
  ASSERT_EQ(reply.ids["silent"].size(), 12u);
  ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
  const v1::Finished& f = events.back().finished();
  EXPECT_EQ(f.reason(), "length");
  EXPECT_EQ(f.output_tokens(), 12u);
  EXPECT_EQ(f.prompt_tokens(), static_cast<uint32_t>(request.prompt_ids_size()));
  EXPECT_EQ(f.moves(), 0u);
  EXPECT_EQ(RanModeName(f), "local");
  for (const v1::GenerateEvent& e : events) EXPECT_FALSE(e.has_moved());
  EXPECT_TRUE(stack->registry().Ejected(lease->node_id)) << "its call failed: out of routing";
}

// A replica lost after its Started while the producer fails its transfer (it cannot reach the
// node): the producer's failure reaches the coordinator first, then the node's call ends
// UNAVAILABLE. The node is gone whatever the producer said, so the started stream moves to the
// other replica and goes on from codes, as it began. The soak met this order with a killed
// replica: the stream ended in the producer's Error ("cannot connect ...: refused or
// unreachable") while another replica was up, because a started target the producer had failed
// did not move.
TEST_F(MigrationTest, AReplicaLostAfterItsProducerFailedTheTransferStillMoves) {
  DiesWhenToldTransferFailed dying;
  ExpectAScriptedReplicaLosesItsStream(&dying, /*allow_local_fallback=*/true);
  EXPECT_TRUE(dying.told()) << "the producer's failure did not come first";
}

// A request that forbids the fallback, whose producer (alive: it answers its Prefill) fails the
// target because it lost the consumer, and whose consumer's call ends UNAVAILABLE after that:
// the stream moves to the other replica and goes on from codes. The coordinator used to cancel
// such a target at once on the producer's failure (without a fallback the request was over),
// and the soak met it: a `fables` stream ended in "transfer session ... peer lost" while the
// other replica was up.
TEST_F(MigrationTest, AConsumerItsProducerLostMovesEvenWithoutAFallback) {
  LostByItsProducer lost;
  ExpectAScriptedReplicaLosesItsStream(&lost, /*allow_local_fallback=*/false);
}

TEST_F(MigrationTest, WithoutAnotherReplicaOrMovesTheStreamEndsInOneError) {
  {
    auto stack = Stack(1);
    std::string killed;
    testing::ServingReply reply = RunKilling(*stack, 1, Request(false), 3, &killed);
    ASSERT_FALSE(killed.empty());
    const std::vector<v1::GenerateEvent>& events = reply.events[kTarget];
    ASSERT_TRUE(events.back().has_error()) << events.back().DebugString();
    for (const v1::GenerateEvent& e : events) EXPECT_FALSE(e.has_moved());
  }
  {
    auto stack = Stack(2);
    v1::GenerateRequest request = Request(false);
    request.set_migration_limit(0);
    std::string killed;
    testing::ServingReply reply = RunKilling(*stack, 2, request, 3, &killed);
    ASSERT_FALSE(killed.empty());
    const std::vector<v1::GenerateEvent>& events = reply.events[kTarget];
    ASSERT_TRUE(events.back().has_error()) << events.back().DebugString();
    for (const v1::GenerateEvent& e : events) EXPECT_FALSE(e.has_moved());
  }
}

}  // namespace
}  // namespace scd
