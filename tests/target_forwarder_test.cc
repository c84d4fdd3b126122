// coordinator/target_forwarder.h: what the client sees of one target's Decode stream -- the
// producer's side added to a Finished from codes (and only there), the producer's cached tokens
// on a Started from codes, auto's prediction only where the predicted mode ran, the fallback
// notice dropped and noted, terminal events marked; a moved stream's new Started becomes the
// client's Moved event, and its Finished counts the moves; whether every streamed id was decoded
// on a locally prefilled cache.
#include "coordinator/target_forwarder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

class TargetForwarderTest : public ::testing::Test {
 protected:
  TargetForwarderTest() {
    route_.producer_cached_tokens = 16;
    RouteTarget scd;
    scd.target = "fables";
    scd.mode = TransferMode::kScd;
    scd.predicted_ttft_us = 1234;
    route_.targets.push_back(scd);
    RouteTarget local;
    local.target = "xs";
    local.mode = TransferMode::kLocal;
    route_.targets.push_back(local);
    producer_.known = true;
    producer_.prefill_us = 700;
    producer_.encode_us = 80;
    producer_.cached_tokens = 32;
    producer_.link = v1::LinkShape();
    producer_.link->set_gbps(2.5);
  }

  static v1::GenerateEvent Started(const std::string& mode, uint32_t cached = 0) {
    v1::GenerateEvent e;
    SetRanMode(*ParseTransferMode(mode), e.mutable_started());
    e.mutable_started()->set_consumer_cached_tokens(cached);
    return e;
  }
  static v1::GenerateEvent Finished(const std::string& mode) {
    v1::GenerateEvent e;
    SetRanMode(*ParseTransferMode(mode), e.mutable_finished());
    e.mutable_finished()->mutable_timings()->set_transfer(50);
    return e;
  }

  Route route_;
  ProducerOutcome producer_;
};

TEST_F(TargetForwarderTest, AFinishedFromCodesCarriesTheProducersSide) {
  TargetForwarder f(&route_, 0, nullptr);
  v1::GenerateEvent started = Started("scd", 8);
  ASSERT_TRUE(f.Rewrite(producer_, &started));
  EXPECT_EQ(started.target(), "fables");
  EXPECT_EQ(started.started().producer_cached_tokens(), 16u);
  EXPECT_TRUE(f.started());
  EXPECT_EQ(f.started_mode(), TransferMode::kScd);
  EXPECT_EQ(f.consumer_cached_tokens(), 8u);
  EXPECT_FALSE(f.terminal());

  v1::GenerateEvent token;
  token.mutable_token()->set_text("x");
  EXPECT_TRUE(f.Rewrite(producer_, &token));
  EXPECT_FALSE(f.terminal());

  v1::GenerateEvent finished = Finished("scd");
  EXPECT_TRUE(f.NeedsProducer(finished));
  ASSERT_TRUE(f.Rewrite(producer_, &finished));
  const v1::Finished& out = finished.finished();
  EXPECT_EQ(out.timings().prefill(), 700u);
  EXPECT_EQ(out.timings().encode(), 80u);
  EXPECT_EQ(out.timings().transfer(), 50u);  // the consumer's own fields stay
  EXPECT_EQ(out.producer_cached_tokens(), 32u);
  EXPECT_EQ(out.link().gbps(), 2.5);
  EXPECT_EQ(out.predicted_ttft_us(), 1234u);  // scd was predicted and ran
  EXPECT_TRUE(f.terminal());
}

TEST_F(TargetForwarderTest, AFallbackIsNotedNotForwardedAndLosesThePrediction) {
  TargetForwarder f(&route_, 0, nullptr);
  v1::GenerateEvent started = Started("scd");
  ASSERT_TRUE(f.Rewrite(producer_, &started));
  v1::GenerateEvent notice = Started("local");
  EXPECT_FALSE(f.Rewrite(producer_, &notice));
  EXPECT_TRUE(f.fell_back());
  EXPECT_EQ(f.started_mode(), TransferMode::kScd);  // the first Started's

  v1::GenerateEvent finished = Finished("local");
  EXPECT_FALSE(f.NeedsProducer(finished));  // a local prefill: no producer side
  ASSERT_TRUE(f.Rewrite(producer_, &finished));
  EXPECT_EQ(finished.finished().timings().prefill(), 0u);
  EXPECT_EQ(finished.finished().producer_cached_tokens(), 0u);
  EXPECT_EQ(finished.finished().predicted_ttft_us(), 0u);  // predicted scd, ran local
}

TEST_F(TargetForwarderTest, ALocalTargetGetsNothingOfTheProducers) {
  TargetForwarder f(&route_, 1, nullptr);
  v1::GenerateEvent started = Started("local");
  ASSERT_TRUE(f.Rewrite(producer_, &started));
  EXPECT_EQ(started.target(), "xs");
  EXPECT_EQ(started.started().producer_cached_tokens(), 0u);
  v1::GenerateEvent finished = Finished("local");
  EXPECT_FALSE(f.NeedsProducer(finished));
  ASSERT_TRUE(f.Rewrite(producer_, &finished));
  EXPECT_EQ(finished.finished().timings().prefill(), 0u);
  EXPECT_FALSE(finished.finished().has_link());
}

TEST_F(TargetForwarderTest, AnErrorIsTerminal) {
  TargetForwarder f(&route_, 0, nullptr);
  v1::GenerateEvent error;
  error.mutable_error()->set_code(14);
  ASSERT_TRUE(f.Rewrite(producer_, &error));
  EXPECT_EQ(error.target(), "fables");
  EXPECT_TRUE(f.terminal());
  EXPECT_FALSE(f.started());
}

TEST_F(TargetForwarderTest, AMovedStreamsStartedBecomesMovedAndItsFinishedCountsTheMove) {
  TargetForwarder f(&route_, 1, nullptr);
  route_.targets[1].consumer_node = "consumer-old";
  v1::GenerateEvent started = Started("local");
  ASSERT_TRUE(f.Rewrite(producer_, &started));
  for (int32_t id : {5, 6, 7}) {
    v1::GenerateEvent token;
    token.mutable_token()->add_ids(id);
    ASSERT_TRUE(f.Rewrite(producer_, &token));
  }
  EXPECT_EQ(f.streamed_ids(), (std::vector<int32_t>{5, 6, 7}));

  Route next;
  RouteTarget replica = route_.targets[1];
  replica.consumer_node = "consumer-new";
  next.targets.push_back(replica);
  TargetForwarder moved = f;  // the next call goes on with the stream's state
  moved.MoveTo(&next, 0, "consumer-old", "its call ended: Socket closed");
  v1::GenerateEvent again = Started("local");
  ASSERT_TRUE(moved.Rewrite(producer_, &again));
  ASSERT_TRUE(again.has_moved()) << again.DebugString();
  EXPECT_EQ(again.target(), "xs");
  EXPECT_EQ(again.moved().tokens_so_far(), 3u);
  EXPECT_EQ(again.moved().from_node(), "consumer-old");
  EXPECT_EQ(again.moved().to_node(), "consumer-new");
  EXPECT_EQ(again.moved().reason(), "its call ended: Socket closed");
  EXPECT_EQ(again.moved().moves(), 1u);
  EXPECT_FALSE(moved.fell_back());  // not a fallback notice
  v1::GenerateEvent token;
  token.mutable_token()->add_ids(8);
  ASSERT_TRUE(moved.Rewrite(producer_, &token));
  EXPECT_EQ(moved.streamed_ids(), (std::vector<int32_t>{5, 6, 7, 8}));
  v1::GenerateEvent finished = Finished("local");
  ASSERT_TRUE(moved.Rewrite(producer_, &finished));
  EXPECT_EQ(finished.finished().moves(), 1u);
  EXPECT_TRUE(moved.terminal());
}

// Whether every streamed id was decoded on a locally prefilled cache
// (DecodeRequest.continued_mode): tokens after a Started from codes are not, unless the consumer
// fell back first; a move to a local replica does not make earlier ids local; a resume is local
// only from a local start.
TEST_F(TargetForwarderTest, ItKnowsWhetherEveryStreamedIdWasDecodedLocally) {
  // Each event rewritten in turn: a Started of its mode, or a token id (a number); what Rewrite
  // returned for each, in order.
  auto feed = [this](TargetForwarder& f, const std::vector<std::string>& events) {
    std::vector<bool> forwarded;
    for (const std::string& what : events) {
      v1::GenerateEvent e;
      if (what == "local" || what == "scd") {
        e = Started(what);
      } else {
        e.mutable_token()->add_ids(std::stoi(what));
      }
      forwarded.push_back(f.Rewrite(producer_, &e));
    }
    return forwarded;
  };
  TargetForwarder local(&route_, 1, nullptr);
  feed(local, {"local", "5"});
  EXPECT_TRUE(local.decoded_locally());

  TargetForwarder fell_back(&route_, 0, nullptr);
  feed(fell_back, {"scd"});
  EXPECT_TRUE(fell_back.decoded_locally()) << "nothing decoded yet";
  // The fallback notice (a second Started, not forwarded), before any token.
  EXPECT_EQ(feed(fell_back, {"local", "5"}), (std::vector<bool>{false, true}));
  EXPECT_TRUE(fell_back.decoded_locally());

  TargetForwarder coded(&route_, 0, nullptr);
  feed(coded, {"scd", "5"});
  EXPECT_FALSE(coded.decoded_locally());
  Route next;
  next.targets.push_back(route_.targets[1]);
  coded.MoveTo(&next, 0, "consumer-old", "gone");
  feed(coded, {"local", "6"});
  EXPECT_FALSE(coded.decoded_locally()) << "its first id came from codes";

  TargetForwarder resumed(&route_, 1, nullptr);
  resumed.Resume({5, 6}, TransferMode::kLocal, "resumed");
  EXPECT_TRUE(resumed.decoded_locally());
  resumed.Resume({5, 6}, TransferMode::kScd, "resumed");
  EXPECT_FALSE(resumed.decoded_locally());
}

}  // namespace
}  // namespace scd::coordinator
