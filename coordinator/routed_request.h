// One Generate on the coordinator, from routed to done, on gRPC's callback API: the request is
// the client's stream (an EventStream, serving/event_stream.h) and owns its state -- the route's
// load on the registry and one in the service's active count (a lease taken in the constructor,
// released when the call ends or the request is destroyed, whichever comes first: every exit
// releases it, and none after the server's shutdown), one call per target, the producer's outcome.
// No thread is held while it runs; its steps run on gRPC's threads as its calls answer:
//   fan-out   Start() starts every target's Consumer.Decode at once, each a ClientReadReactor
//             whose events a TargetForwarder rewrites and the client's stream queues;
//   refusal   every target refused before starting: the request is refused as a whole;
//   prefill   once every target started or ended, one Producer.Prefill (async; a child of the
//             client's call, so a client that goes away cancels it and its sessions) for the
//             targets that take codes; a Finished from codes waits for its answer at most 2 s.
//             Early prefill (CoordinatorOptions::early_prefill, on by default): when the route
//             already says what the Started will (one target, a transfer mode, a consumer holding
//             none of the prompt's blocks), the Prefill goes out just before the Decode
//             (DecodeRequest.early_prefill: the consumer loads nothing from its prefix cache and
//             keeps a session that comes first), so the producer's pass waits for no hop to the
//             consumer and back (~1 ms here); a target refused before starting cancels it, and
//             targets the producer failed before they started are settled once they start. A
//             consumer that would queue the request declines the early prefill (its early session
//             refused, Started.early_prefill_declined once admitted): that Prefill is retired and
//             the producer asked again as without early prefill (the producer must not wait on a
//             request that holds no slot while the requests ahead of it wait for their sessions
//             behind that wait);
//   move      a target whose consumer died (its call ended without a terminal event the
//             coordinator did not cause) or ended it with a retryable Error (UNAVAILABLE,
//             ABORTED) after its Started moves to another live replica of the target (the same
//             weights; none given up for this request): a new Decode with the
//             output ids streamed so far (DecodeRequest.continued_ids), under the request's
//             deadline -- a stream that began from codes in its mode (the same artifact and
//             point; codes for the prompt from a live producer of the model, asked once the new
//             Started came, the streamed ids prefilled on top), else in local mode; its Started
//             becomes the client's Moved event (TargetForwarder), at most
//             the request's migration_limit (at most the deployment's) times per target. A
//             target whose node is gone before its Started (its call UNAVAILABLE, or cancelled by
//             that node: refused, reset, draining) moves the same way in local mode, and the
//             new replica's Started is the client's (Finished.moves counts it);
//   resume    a client whose coordinator went away sends the request again through this one
//             (resume_token.h; a fan-out's targets each alone, the request narrowed to the
//             token's target): the target's call begins with the ids it received as
//             continued_ids, the Prefill follows its Started as without early prefill, and the
//             Started is the client's Moved (resumed);
//   takeover  a consumer whose transfer lost its producer says so (GenerateEvent.transfer_lost,
//             never forwarded) with the layers it rebuilt: another live producer of the model
//             sends the rest (a Prefill with PrefillTarget.layer_begin under TakeoverSessionId)
//             where that is predicted sooner than the consumer's own prefill
//             (producer_takeover.h), else the consumer is told (Consumer.TransferFailed of the
//             takeover's session) and falls back at once;
//   settle    a target the producer failed is told (Consumer.TransferFailed) and given the grace to
//             announce a fallback or ask for a takeover (a timer); else cancelled, and its Error
//             written;
//   end       once every target's call ended (its terminal event written) the stream ends.
// Flow control: when the client's stream has kEventsQueued events queued, the targets stop
// reading until it drains (a slow client slows its own request only).
// The request has one cancellation (the stream's: the client gone, its deadline, a failed write,
// shutdown); its callback cancels every target's call at once.
// Lifetime: deleted when gRPC is done with the call and every target call, the Prefill and the
// timers have answered (holds: EventStream).
// Thread-safety: the state is under one mutex; the steps run on any gRPC thread.
// One concept in a long file: the steps above share one request's state and its lock, and each
// reads what the others left (a move needs the forwarder's tokens, settling the calls' failures).
#ifndef SCD_COORDINATOR_ROUTED_REQUEST_H_
#define SCD_COORDINATOR_ROUTED_REQUEST_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/node_registry.h"
#include "coordinator/target_forwarder.h"
#include "proto/cluster_secret.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/inference.pb.h"
#include "serving/event_stream.h"
#include "serving/serving_metrics.h"

namespace scd::coordinator {

// What a routed request uses of its service (none owned; all outlive the request).
// The Finished the coordinator writes itself for a stream that had every token it may have
// (max_tokens) but not its Finished (its consumer lost, or its client's coordinator gone):
// reason length, each of `output_tokens` counted once, no timings (no consumer measured them).
v1::GenerateEvent FinishedAfterLastToken(const v1::GenerateRequest& request,
                                         const std::string& target, size_t output_tokens,
                                         TransferMode mode, uint32_t moves, std::string why);

struct RoutedRequestDeps {
  NodeRegistry* registry = nullptr;
  const ClusterSecret* secret = nullptr;  // attached to every call to a node
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> channel;
  ServingMetrics* metrics = nullptr;        // null: none recorded
  std::atomic<uint32_t>* active = nullptr;  // the service's count of requests running
  // After the producer failed a target, how long its consumer may take to announce a fallback.
  absl::Duration failed_target_grace = absl::Seconds(2);
  // How long a Finished from codes waits for the producer's Prefill answer.
  absl::Duration producer_answer_wait = absl::Seconds(2);
  // Starts the producer's Prefill with the Decode where the route allows (early prefill, above).
  bool early_prefill = true;
  // Moves a target's stream may make to another replica (the request may ask for fewer).
  uint32_t migration_limit = 3;
  // A target's resume token for its client (resume_token.h) over the request as received, by
  // the mode its Started names; null: none given (a resumed stream, whose client has one).
  std::function<std::string(const v1::GenerateRequest& request, TransferMode started,
                            const std::string& target)>
      resume_token;
  // Tells a target's consumer that its transfer failed (Consumer.TransferFailed); must not block.
  std::function<void(const RouteTarget& target, const std::string& session_id,
                     const std::string& reason)>
      tell_failed;
};

class RoutedRequest final : public EventStream {
 public:
  // Events queued for the client before the targets stop reading.
  static constexpr size_t kEventsQueued = 64;

  // `req` has its request id; `route` was resolved for it with `hint`. `ended`: EventStream's.
  RoutedRequest(RoutedRequestDeps deps, v1::GenerateRequest req, Route route,
                const PrefixHint* hint, absl::Time deadline, grpc::CallbackServerContext* context,
                Ended ended);

  // Before Start, for a resumed request (one target; deps without early prefill): its client has
  // `received` output ids already (`started`: the mode its token says the stream started in);
  // the consumer continues after them and the client gets a Moved event where a Started would
  // come.
  void Resume(std::vector<int32_t> received, TransferMode started);
  // Starts every target's call; the request then runs by itself. Called once.
  void Start();

 private:
  class TargetCall;
  struct PrefillCall;
  class Lease;
  enum class Phase { kStarting, kPrefill, kSettled };

  ~RoutedRequest() override;
  void OnRoom() override;
  // Runs `f` under the lock, moves the request on (Advance), then ends the call if that is due.
  template <typename F>
  void Locked(F&& f);

  // A target's event, read: forwarded (or parked until the producer answered); true when its
  // reader may read on at once.
  bool OnEvent(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTargetDone(TargetCall* call, const grpc::Status& status);
  // Moves the request on as far as its state allows (after any change).
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The whole request's refusal, when every target refused before starting.
  std::optional<grpc::Status> Refusal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the Prefill starts with the Decode calls (early prefill, above).
  static bool EarlyPrefill(const RoutedRequestDeps& deps, const Route& route);
  // Starts the producer's Prefill for the targets that take codes (none: the producer is known):
  // as their Started said, or as routed (early prefill).
  void StartPrefill() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every target started or ended: the Prefill started (or not needed), the request settled
  // or refused.
  void EndStarting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `call`'s answer; one that is not the current Prefill (retired when the consumer declined the
  // early prefill) is ignored.
  void OnPrefillDone(const PrefillCall* call, const grpc::Status& status);
  // Early prefill asked and not declined (the Prefill goes as routed, not as Started says).
  bool Early() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return early_prefill_ && !early_declined_;
  }
  // The session id the Prefill's codes travel under.
  const std::string& PrefillSessionId() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return early_declined_ ? declined_session_id_ : session_id_;
  }
  void Settle(std::vector<TargetCall*> failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forwards the events parked for the producer's answer (known, or waited for long enough).
  void ReleaseParked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fire` under the lock at `when` on the registry's clock, holding the request until then
  // or until CancelTimer (outside the lock) takes the timer back.
  Clock::TimerId SetTimer(absl::Time when, std::function<void()> fire);
  void CancelTimer(Clock::TimerId id);
  Clock* clock() const { return deps_.registry->clock(); }
  void Write(const v1::GenerateEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Error a target gets when its Decode call ended without a terminal event.
  void EndWithoutTerminal(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads on, or pauses while the client's stream is full.
  void ReadOn(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every token the target may give was streamed (max_tokens of them) and the request is not
  // cancelled (a cancelled one ends as cancelled, its stream gone): a consumer lost before
  // its Finished leaves nothing to move, and EndStreamed writes that Finished (reason length).
  bool AllStreamed(const TargetCall* call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndStreamed(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `call`'s stream may still move (no terminal event, moves left, the request neither
  // cancelled nor past its deadline).
  bool MayMove(const TargetCall* call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `call`'s stream to another replica (the move step above); false when none takes it
  // (the caller ends the target with its Error).
  bool Move(TargetCall* call, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Decode calls Move made, begun once the lock is released.
  void BeginMoved(std::vector<TargetCall*> calls);
  // A stream moved in a transfer mode, once its new Started came: the producer's Prefill of the
  // prompt for it alone, under its own session id (kept in moved_prefills_).
  void StartMovedPrefill(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its answer: a failure is told to the consumer (Consumer.TransferFailed), which then falls
  // back to its own prefill or ends the target, as the request allows.
  void OnMovedPrefillDone(const PrefillCall& prefill, TargetCall* call, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The takeover step above, for `call`'s notice `lost`.
  void OnTransferLost(TargetCall* call, const v1::TransferLost& lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Prefill for `call` alone under `session_id` to the producer at `address` (a moved stream's,
  // a takeover's), kept in moved_prefills_; `done` runs under the lock with its answer.
  void StartTargetPrefill(TargetCall* call, const std::string& session_id,
                          const std::string& address, uint32_t cached_tokens, uint32_t layer_begin,
                          std::function<void(const PrefillCall&, const grpc::Status&)> done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A takeover's answer: a failure is told to the consumer (as a moved stream's).
  void OnTakeoverDone(const PrefillCall& prefill, TargetCall* call, const std::string& producer,
                      const std::string& session_id, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RoutedRequestDeps deps_;
  const v1::GenerateRequest req_;
  const Route route_;
  const std::string id_;          // for logs
  const std::string session_id_;  // the producer's sessions to the targets
  const absl::Time routed_at_;    // where the predictions' clocks start
  const absl::Time deadline_;
  const bool early_prefill_;               // asked for with the Decode (EarlyPrefill)
  const std::string declined_session_id_;  // EarlyDeclinedSessionId(session_id_)
  grpc::CallbackServerContext* const context_;
  absl::Mutex mu_;  // everything below
  std::unique_ptr<Lease> lease_ ABSL_GUARDED_BY(mu_);
  std::optional<ServingMetrics::Call> metrics_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  bool full_ ABSL_GUARDED_BY(mu_) = false;  // the client's stream is at its capacity
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_due_ ABSL_GUARDED_BY(mu_);  // End with it once unlocked
  ProducerOutcome producer_ ABSL_GUARDED_BY(mu_);
  // The consumer queued the request and declined the early prefill (Started said so): the
  // Prefill goes again once it started, as without early prefill, under declined_session_id_.
  bool early_declined_ ABSL_GUARDED_BY(mu_) = false;
  // Targets an early Prefill failed before every target started: settled once they have.
  std::vector<TargetCall*> failed_early_ ABSL_GUARDED_BY(mu_);
  // One call per target, the current one: a move replaces its target's entry (under mu_ and
  // calls_mu_; the cancel callback reads it under calls_mu_ alone) and keeps the call it replaced
  // in retired_calls_ until the request is deleted (its gRPC reactions may still run).
  absl::Mutex calls_mu_;
  std::vector<std::unique_ptr<TargetCall>> calls_;
  std::vector<std::unique_ptr<TargetCall>> retired_calls_;
  std::set<std::string> given_up_ ABSL_GUARDED_BY(mu_);  // consumer nodes a stream moved away from
  std::vector<TargetCall*> to_begin_ ABSL_GUARDED_BY(mu_);  // moved calls to begin once unlocked
  std::unique_ptr<PrefillCall> prefill_;
  std::unique_ptr<PrefillCall> retired_prefill_;  // the declined early one, until it answers
  // Moved streams' and takeovers' Prefills (StartTargetPrefill), until the request is deleted.
  std::vector<std::unique_ptr<PrefillCall>> moved_prefills_ ABSL_GUARDED_BY(mu_);
  Clock::TimerId producer_wait_ ABSL_GUARDED_BY(mu_) =
      0;                                           // the parked events' wait for the producer
  Clock::TimerId grace_ ABSL_GUARDED_BY(mu_) = 0;  // the failed targets' grace
  // Cancels every target's call (TryCancel is safe from any thread, before the call starts too).
  Cancellation::Registration cancel_calls_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_ROUTED_REQUEST_H_
