// SessionRouter over the in-process transport: sessions reach the ticket of their tag, also when
// they arrive before it (an early prefill) within the router's wait, on a simulated clock; one
// never expected is refused at the end of that wait, one for an ended request at once; and a
// transfer reported failed (the coordinator's Consumer.TransferFailed) ends the wait at once, is
// refused if it arrives afterwards, and is cancelled if it had arrived.
#include "consumer/session_router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/simulated_clock.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::consumer {
namespace {

using ::testing::HasSubstr;

class SessionRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = *transport::CreateTransport({});
    router_ = std::make_unique<SessionRouter>(
        std::make_unique<transport::SessionAcceptor>(*transport_->Listen("router:0"),
                                                     transport::ConnectionOptions()),
        &clock_, kEarlyWait);
    connection_ = transport::TransferConnection::Create(
        *transport_->Connect(router_->address(), absl::Seconds(1)), {});
  }
  void TearDown() override {
    connection_->Close();
    router_.reset();
  }
  std::shared_ptr<transport::SendSession> Open(const std::string& tag) {
    v1::TransferHeader header;
    header.set_request_id(tag);
    absl::StatusOr<std::shared_ptr<transport::SendSession>> session =
        connection_->StartSession(header, absl::Seconds(30));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *session : nullptr;
  }

  // Until `n` sessions arrived early: each sets its wait's timer on the router's clock.
  void AwaitEarly(size_t n) {
    clock_.AwaitPending(n);
    ASSERT_EQ(router_->early(), n);
  }

  static constexpr absl::Duration kEarlyWait = absl::Seconds(5);
  SimulatedClock clock_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<SessionRouter> router_;
  std::shared_ptr<transport::TransferConnection> connection_;
};

TEST_F(SessionRouterTest, TheExpectedSessionReachesItsTicket) {
  auto ticket = *router_->Expect("a#c");
  EXPECT_EQ(router_->Expect("a#c").status().code(), absl::StatusCode::kAlreadyExists);
  auto sent = Open("a#c");
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> got =
      ticket->Wait(absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->header().request_id(), "a#c");
  // One nobody expects waits for its request (the router's wait), then is refused (cancelled,
  // naming the tag).
  auto stray = Open("b#c");
  AwaitEarly(1);
  clock_.Advance(kEarlyWait - absl::Milliseconds(1));
  EXPECT_EQ(stray->state(), transport::SessionState::kOpen);
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(stray->WaitForEnd(absl::Seconds(10)));
  EXPECT_EQ(stray->state(), transport::SessionState::kCancelled);
  EXPECT_THAT(stray->status().message(), HasSubstr("b#c"));
  EXPECT_EQ(router_->refused(), 1);
  EXPECT_EQ(router_->early(), 0u);
  // Refused for good: its request coming later waits for a session that will not come.
  auto late_ticket = *router_->Expect("b#c");
  EXPECT_EQ(late_ticket->Wait(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SessionRouterTest, ASessionAheadOfItsRequestReachesItsTicketWhenItComes) {
  auto sent = Open("a#c");
  AwaitEarly(1);
  clock_.Advance(kEarlyWait / 2);
  auto ticket = *router_->Expect("a#c");
  EXPECT_EQ(router_->early(), 0u);
  bool ready = false;
  ticket->OnArrival([&] { ready = true; });  // there already: called at once
  EXPECT_TRUE(ready);
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> got =
      ticket->Wait(absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->header().request_id(), "a#c");
  clock_.Advance(kEarlyWait);  // its wait's timer was taken back: nothing is refused
  EXPECT_EQ((*got)->state(), transport::SessionState::kOpen);
  EXPECT_EQ(router_->refused(), 0);
}

TEST_F(SessionRouterTest, ASessionForAnEndedRequestIsRefusedAtOnce) {
  { auto ticket = *router_->Expect("a#c"); }  // the request ended before its session came
  auto late = Open("a#c");
  ASSERT_TRUE(late->WaitForEnd(absl::Seconds(10)));  // no clock advanced
  EXPECT_EQ(late->state(), transport::SessionState::kCancelled);
  EXPECT_EQ(router_->refused(), 1);
  EXPECT_EQ(router_->early(), 0u);
}

TEST_F(SessionRouterTest, EarlySessionsBeyondTheCapAreRefusedAtOnce) {
  std::vector<std::shared_ptr<transport::SendSession>> kept;
  for (size_t i = 0; i < SessionRouter::kMaxEarly; ++i) kept.push_back(Open(absl::StrCat(i, "#c")));
  AwaitEarly(SessionRouter::kMaxEarly);
  auto over = Open("over#c");
  ASSERT_TRUE(over->WaitForEnd(absl::Seconds(10)));  // no clock advanced
  EXPECT_EQ(over->state(), transport::SessionState::kCancelled);
  EXPECT_EQ(router_->refused(), 1);
  EXPECT_EQ(kept.front()->state(), transport::SessionState::kOpen);
  // The router's end ends those still waiting.
  router_.reset();
  ASSERT_TRUE(kept.back()->WaitForEnd(absl::Seconds(10)));
  EXPECT_NE(kept.back()->state(), transport::SessionState::kCompleted);
}

TEST_F(SessionRouterTest, AFailureReportedBeforeTheSessionArrivesEndsTheWaitAtOnce) {
  auto ticket = *router_->Expect("a#c");
  EXPECT_EQ(router_->Fail("a#c", absl::UnavailableError("producer p failed: Socket closed")),
            SessionRouter::FailOutcome::kWaiting);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> got =
      ticket->Wait(absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the 30 s timeout
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("Socket closed"));
  // Told twice: the first reason stays.
  EXPECT_EQ(router_->Fail("a#c", absl::UnavailableError("again")),
            SessionRouter::FailOutcome::kWaiting);
  EXPECT_THAT(ticket->Wait(absl::ZeroDuration()).status().message(), HasSubstr("Socket closed"));
  // The session arriving late (a producer that was only slow) is refused, not buffered.
  auto late = Open("a#c");
  ASSERT_TRUE(late->WaitForEnd(absl::Seconds(10)));
  EXPECT_EQ(late->state(), transport::SessionState::kCancelled);
  EXPECT_EQ(router_->refused(), 1);
}

TEST_F(SessionRouterTest, AFailureReportedAfterTheSessionArrivedCancelsIt) {
  auto ticket = *router_->Expect("a#c");
  auto sent = Open("a#c");
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> got =
      ticket->Wait(absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(router_->Fail("a#c", absl::UnavailableError("producer p failed")),
            SessionRouter::FailOutcome::kReceiving);
  EXPECT_EQ((*got)->state(), transport::SessionState::kCancelled);
  // The sender hears it (the producer, if it is still there, stops sending).
  ASSERT_TRUE(sent->WaitForEnd(absl::Seconds(10)));
  EXPECT_NE(sent->state(), transport::SessionState::kCompleted);
  // Ended already: nothing more to do.
  EXPECT_EQ(router_->Fail("a#c", absl::UnavailableError("again")),
            SessionRouter::FailOutcome::kNone);
}

TEST_F(SessionRouterTest, AFailureForATagNobodyExpectsFindsNone) {
  EXPECT_EQ(router_->Fail("x#c", absl::UnavailableError("gone")),
            SessionRouter::FailOutcome::kNone);
  {
    auto ticket = *router_->Expect("x#c");
  }  // the request ended: its ticket is gone
  EXPECT_EQ(router_->Fail("x#c", absl::UnavailableError("gone")),
            SessionRouter::FailOutcome::kNone);
}

// A request may outlive the router (a node stopping while requests still run; serving_test's
// TheProducerDropsTheConnectionOfAConsumerThatIsGone, whose last request's ticket was let go on
// the decode thread after the router was destroyed: a segfault in CI). Its ticket then finds the
// router stopping: the session that had arrived is still its own, a wait is UNAVAILABLE, another
// expectation (a takeover's) is refused, and failing or dropping it touches nothing destroyed.
TEST_F(SessionRouterTest, ATicketOutlivingItsRouterFindsItStopping) {
  auto arrived = *router_->Expect("a#c");
  auto sent = Open("a#c");
  ASSERT_TRUE(arrived->Wait(absl::Seconds(10)).ok());
  auto waiting = *router_->Expect("b#c");
  bool woken = false;
  waiting->OnArrival([&] { woken = true; });
  auto late = *router_->Expect("c#c");
  router_.reset();
  EXPECT_TRUE(woken);  // the router's end wakes a wait
  EXPECT_EQ(waiting->Wait(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(waiting->Wait(absl::ZeroDuration()).status().message()),
              HasSubstr("shutting down"));
  bool late_woken = false;
  late->OnArrival([&] { late_woken = true; });  // at once: Wait returns at once already
  EXPECT_TRUE(late_woken);
  EXPECT_EQ(waiting->Expect("d#c").status().code(), absl::StatusCode::kUnavailable);
  waiting->FailWaiting(absl::DeadlineExceededError("late"));  // its timer's, firing now
  EXPECT_EQ(waiting->Wait(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> got =
      arrived->Wait(absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->header().request_id(), "a#c");
  EXPECT_EQ(arrived->Fail(absl::CancelledError("the request ended")),
            SessionRouter::FailOutcome::kNone);  // the acceptor's Close ended it
  arrived.reset();
  waiting.reset();
  late.reset();
}

}  // namespace
}  // namespace scd::consumer
