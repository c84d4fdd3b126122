#include "consumer/served_request.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/log_text.h"
#include "codec/transfer_mode.h"
#include "proto/grpc_util.h"
#include "serving/checked_inference.h"

namespace scd::consumer {

namespace {

// What a served request holds from its admission to its end.
struct Serving {
  Cancellation::Registration wake;  // ServedRequest::on_cancel
  std::unique_ptr<Admission::Reservation> reservation;
  std::optional<ServingMetrics::Call> metrics;
  Cancellation* cancellation = nullptr;
  EventSink write_event;
  std::string id;
  Tally* outcomes = nullptr;
  ServeDone done;

  void Write(const v1::GenerateEvent& event) {
    metrics->Observe(event);
    if (!cancellation->cancelled()) write_event(event);
  }
  // The run ended with `status` (the terminal event's): logs, counts, gives back what it held,
  // then tells the caller.
  void End(const absl::Status& status) {
    const bool cancelled = cancellation->cancelled();
    spdlog::info("[{}] ended: {}{}", id, ForLog(status.ToString(), 300),
                 cancelled ? " (cancelled)" : "");
    if (outcomes != nullptr) {
      outcomes->Add(cancelled ? "request_cancelled"
                    : status.ok()
                        ? "request_finished"
                        : absl::StrCat("request_", absl::AsciiStrToLower(
                                                       absl::StatusCodeToString(status.code()))));
    }
    wake.Reset();
    reservation.reset();
    metrics.reset();
    const ServeDone finish = std::move(done);
    finish(cancelled ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller")
                     : grpc::Status::OK);  // the terminal event carries the outcome
  }
};

// The admitted request's TargetRun, started.
void StartAdmitted(const ConsumerModel& consumer, const Admission& admission,
                   const std::shared_ptr<Serving>& serving, ServedRequest& served,
                   std::unique_ptr<Admission::Reservation> reservation) {
  spdlog::info("[{}] admitted for {}{} ({} of {} running, {} KV bytes reserved, waited {})",
               served.id, TransferModeName(served.route.mode),
               served.route.producer.empty() ? "" : " from " + ForLog(served.route.producer),
               admission.active(), admission.capacity(), reservation->bytes(),
               absl::FormatDuration(reservation->waited()));
  serving->reservation = std::move(reservation);
  serving->metrics.emplace(consumer.metrics);

  RunContext run;
  run.received = served.received;
  run.call_deadline = served.call_deadline;
  run.cancellation = serving->cancellation;
  run.prompt_ids = std::move(served.prompt_ids);
  run.session = std::move(served.session);
  run.on_session = std::move(served.on_session);
  Serving* const s = serving.get();
  if (served.announce_fallback) {
    run.on_fallback = [s](const v1::GenerateEvent& started) {
      spdlog::info("[{}] falling back: {}", s->id, ForLog(started.started().mode_reason(), 300));
      s->Write(started);
    };
  }
  if (served.take_over) {
    run.take_over = [s, expect = std::move(served.take_over)](
                        const v1::GenerateEvent& notice,
                        Cancellation* cancellation) -> absl::StatusOr<RunContext::Takeover> {
      v1::GenerateEvent sent = notice;
      absl::StatusOr<RunContext::Takeover> takeover = expect(&sent, cancellation);
      if (!takeover.ok()) return takeover.status();
      spdlog::info("[{}] transfer lost ({} of {} layers rebuilt): takeover {} asked for: {}", s->id,
                   sent.transfer_lost().layers_rebuilt(), sent.transfer_lost().layers(),
                   sent.transfer_lost().takeover(), ForLog(sent.transfer_lost().reason(), 300));
      s->Write(sent);
      return takeover;
    };
  }
  // Exceptions in the run's first step are caught here; its later steps guard themselves
  // (TargetRun::Post), the scheduler its own thread.
  const absl::Status started = GuardExceptions(served.handler, [&] {
    StartTarget(
        consumer, served.request, served.route, std::move(run),
        [serving](const v1::GenerateEvent& event) { serving->Write(event); },
        [serving](absl::Status status) { serving->End(status); });
    return absl::OkStatus();
  });
  if (!started.ok()) s->End(started);
}

// Admits the request (for an early prefill: now or never, DeclineEarly), then starts it.
void AdmitServed(const ConsumerModel& consumer, Admission& admission,
                 const std::shared_ptr<Serving>& serving,
                 const std::shared_ptr<ServedRequest>& served, absl::Time deadline);
// The early request would wait: it declines the early prefill, then waits as any other.
void DeclineEarly(const ConsumerModel& consumer, Admission& admission,
                  const std::shared_ptr<Serving>& serving,
                  const std::shared_ptr<ServedRequest>& served, absl::Time deadline);

}  // namespace

void ServeRequest(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                  Cancellation* cancellation, EventSink write_event, ServedRequest served_in,
                  ServeDone done) {
  auto served = std::make_shared<ServedRequest>(std::move(served_in));
  const v1::GenerateRequest& req = served->request;
  auto serving = std::make_shared<Serving>();
  serving->cancellation = cancellation;
  serving->write_event = std::move(write_event);
  serving->id = served->id;
  serving->outcomes = outcomes;
  serving->done = std::move(done);
  // Admitted by KV memory, waiting in the queue while it does not fit (the coordinator asks the
  // producer to send only once Decode has started; an early prefill's request is admitted at
  // once or declines it, served_request.h); a caller that goes away leaves the queue. The wait
  // holds no thread.
  if (consumer.steps == nullptr || consumer.scheduler == nullptr) {
    const ServeDone finish = std::move(serving->done);
    return finish(grpc::Status(grpc::StatusCode::INTERNAL,
                               "the consumer has no decode scheduler or step queue"));
  }
  if (served->on_cancel) serving->wake = cancellation->OnCancel(served->on_cancel);
  AdmitServed(consumer, admission, serving, served,
              RequestDeadline(consumer, req, served->received, served->call_deadline));
}

namespace {

void AdmitServed(const ConsumerModel& consumer, Admission& admission,
                 const std::shared_ptr<Serving>& serving,
                 const std::shared_ptr<ServedRequest>& served, absl::Time deadline) {
  // An early prefill's request is admitted now or declines the early prefill (served_request.h).
  const bool early = served->route.early_prefill && served->decline_early;
  admission.AdmitAsync(
      ReservationBytes(consumer, served->request,
                       served->prompt_ids.size() - static_cast<size_t>(served->route.continued)),
      deadline, serving->cancellation,
      [&consumer, &admission, serving, served, deadline, early](Admission::Admitted reservation) {
        if (early && absl::IsAborted(reservation.status())) {
          return DeclineEarly(consumer, admission, serving, served, deadline);
        }
        if (!reservation.ok()) {
          CountRefusal(serving->outcomes, reservation.status());
          spdlog::info("[{}] refused: {}", served->id,
                       ForLog(reservation.status().ToString(), 300));
          serving->wake.Reset();
          const ServeDone finish = std::move(serving->done);
          finish(ToGrpcStatus(reservation.status()));
          return;
        }
        // Admitted on the caller's thread or later on the thread that freed the memory (the
        // scheduler's, which must not load a prefix): the run starts as a step-queue job.
        auto admitted =
            std::make_shared<std::unique_ptr<Admission::Reservation>>(*std::move(reservation));
        consumer.steps->Run([&consumer, &admission, serving, served, admitted] {
          StartAdmitted(consumer, admission, serving, *served, std::move(*admitted));
        });
      },
      early ? Admission::IfFull::kRefuse : Admission::IfFull::kQueue);
}

void DeclineEarly(const ConsumerModel& consumer, Admission& admission,
                  const std::shared_ptr<Serving>& serving,
                  const std::shared_ptr<ServedRequest>& served, absl::Time deadline) {
  serving->wake.Reset();  // the early session's cancel hook goes with it
  if (absl::Status declined = served->decline_early(served.get()); !declined.ok()) {
    CountRefusal(serving->outcomes, declined);
    spdlog::info("[{}] refused: {}", served->id, ForLog(declined.ToString(), 300));
    const ServeDone finish = std::move(serving->done);
    return finish(ToGrpcStatus(declined));
  }
  if (serving->outcomes != nullptr) serving->outcomes->Add("early_prefill_declined");
  spdlog::info("[{}] queued: the early prefill declined (the producer is asked once admitted)",
               served->id);
  if (served->on_cancel) serving->wake = serving->cancellation->OnCancel(served->on_cancel);
  AdmitServed(consumer, admission, serving, served, deadline);
}

}  // namespace

EventStream* ServeOnStream(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                           EventStream::Ended ended, ServedRequest served) {
  // A request's events are at most max_tokens + 3 (Started, a fallback notice, the held-back
  // text, the terminal event): the stream's queue is bounded by the request itself, and the
  // scheduler never waits for a slow caller.
  auto* stream = new EventStream(kQueuedEvents, std::move(ended));
  stream->Hold();  // released when the request ended
  ServeRequest(
      consumer, admission, outcomes, &stream->cancellation(),
      [stream](const v1::GenerateEvent& event) { stream->Push(event); }, std::move(served),
      [stream](const grpc::Status& status) {
        stream->End(status);
        stream->Release();
      });
  return stream;
}

}  // namespace scd::consumer
