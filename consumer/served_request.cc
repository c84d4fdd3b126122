#include "consumer/served_request.h"

#include <spdlog/spdlog.h>

#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/log_text.h"
#include "codec/transfer_mode.h"
#include "proto/checked_inference.h"
#include "proto/grpc_util.h"

namespace scd::consumer {

grpc::Status ServeRequest(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                          Cancellation* cancellation_in, const EventSink& write_event,
                          ServedRequest served) {
  const v1::GenerateRequest& req = served.request;
  const std::string& id = served.id;
  // Admitted by KV memory, waiting in the queue while it does not fit (the coordinator asks the
  // producer to send only once Decode has started); a caller that goes away leaves the queue.
  Cancellation& cancellation = *cancellation_in;
  Cancellation::Registration wake;
  if (served.on_cancel) wake = cancellation.OnCancel(served.on_cancel);
  const absl::Time deadline =
      served.received +
      (req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms()) : consumer.default_deadline);
  absl::StatusOr<std::unique_ptr<Admission::Reservation>> reservation = admission.Admit(
      ReservationBytes(consumer, req, served.prompt_ids.size()), deadline, &cancellation);
  if (!reservation.ok()) {
    CountRefusal(outcomes, reservation.status());
    spdlog::info("[{}] refused: {}", id, ForLog(reservation.status().ToString(), 300));
    return ToGrpcStatus(reservation.status());
  }
  spdlog::info("[{}] admitted for {}{} ({} of {} running, {} KV bytes reserved, waited {})", id,
               TransferModeName(served.route.mode),
               served.route.producer.empty() ? "" : " from " + ForLog(served.route.producer),
               admission.active(), admission.capacity(), (*reservation)->bytes(),
               absl::FormatDuration((*reservation)->waited()));

  RunContext run;
  run.received = served.received;
  run.cancellation = &cancellation;
  run.prompt_ids = std::move(served.prompt_ids);
  run.session = std::move(served.session);
  ServingMetrics::Call metrics(consumer.metrics);
  auto write = [&](const v1::GenerateEvent& event) {
    metrics.Observe(event);
    if (!cancellation.cancelled()) write_event(event);
  };
  if (served.announce_fallback) {
    run.on_fallback = [&](const v1::GenerateEvent& started) {
      spdlog::info("[{}] falling back: {}", id, ForLog(started.started().mode_reason(), 300));
      write(started);
    };
  }
  const absl::Status status = GuardExceptions(
      served.handler, [&] { return RunTarget(consumer, req, served.route, run, write); });
  const bool cancelled = cancellation.cancelled();
  spdlog::info("[{}] ended: {}{}", id, ForLog(status.ToString(), 300),
               cancelled ? " (cancelled)" : "");
  if (outcomes != nullptr) {
    outcomes->Add(cancelled ? "request_cancelled"
                  : status.ok()
                      ? "request_finished"
                      : absl::StrCat("request_", absl::AsciiStrToLower(
                                                     absl::StatusCodeToString(status.code()))));
  }
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
  return grpc::Status::OK;  // the terminal event carries the outcome
}

EventStream* ServeOnStream(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                           EventStream::Ended ended, ServedRequest served) {
  // Up to this many events wait for a slow caller before the run waits for it.
  constexpr size_t kQueuedEvents = 64;
  auto* stream = new EventStream(kQueuedEvents, std::move(ended));
  stream->Hold();  // released when the run ends
  std::thread([&consumer, &admission, outcomes, stream, served = std::move(served)]() mutable {
    const grpc::Status status = ServeRequest(
        consumer, admission, outcomes, &stream->cancellation(),
        [stream](const v1::GenerateEvent& event) { stream->PushAndWait(event); },
        std::move(served));
    stream->End(status);
    stream->Release();
  }).detach();
  return stream;
}

}  // namespace scd::consumer
