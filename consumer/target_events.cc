#include "consumer/target_events.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "consumer/request_runner.h"
#include "proto/frontier_proto.h"
#include "proto/wire_mode.h"

namespace scd::consumer {
namespace {

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

}  // namespace

std::string LoweredText(const std::vector<LoweredLayer>& lowered) {
  std::vector<std::string> parts;
  for (const LoweredLayer& l : lowered) {
    std::vector<std::string> ranks;
    if (l.rank_k > 0) ranks.push_back(absl::StrCat("K ", l.rank_k));
    if (l.rank_v > 0) ranks.push_back(absl::StrCat("V ", l.rank_v));
    if (l.rank_h > 0) ranks.push_back(absl::StrCat("H ", l.rank_h));
    parts.push_back(absl::StrCat(l.layer, " (", absl::StrJoin(ranks, ", "), ")"));
  }
  return absl::StrCat("; the link fell behind: layer", lowered.size() > 1 ? "s " : " ",
                      absl::StrJoin(parts, ", "), " sent at lower ranks");
}

v1::GenerateEvent StartedEvent(const std::string& consumer, const v1::GenerateRequest& request,
                               const TargetRoute& route) {
  v1::GenerateEvent e;
  e.set_target(consumer);
  v1::Started* started = e.mutable_started();
  started->set_request_id(request.request_id());
  started->set_producer(route.mode == TransferMode::kLocal ? "" : route.producer);
  started->set_consumer(consumer);
  SetRanMode(route.mode, started);
  started->set_mode_reason(route.mode_reason);
  started->set_early_prefill_declined(route.early_declined);
  if (route.point && route.mode != TransferMode::kLocal) {
    *started->mutable_point() = CodePointToProto(*route.point);
    started->set_expected_kl(route.expected_kl);
  }
  return e;
}

v1::GenerateEvent FallbackNotice(const v1::GenerateEvent& started, const PrefixOutcome& prefix) {
  v1::GenerateEvent notice = started;
  SetRanMode(prefix.mode, notice.mutable_started());
  notice.mutable_started()->set_mode_reason(prefix.reason);
  notice.mutable_started()->clear_expected_payload_bytes();
  notice.mutable_started()->clear_point();
  notice.mutable_started()->clear_expected_kl();
  return notice;
}

bool ProducerLost(const absl::Status& why) {
  // UNAVAILABLE: peer lost, or the coordinator's report (Consumer.TransferFailed); ABORTED: the
  // producer gave the session up by its own failure (SendSession::Abort). Not CANCELLED: the
  // producer's caller called it off -- the coordinator, whose cancel of this request is on its
  // way (a client that left reaches the producer's Prefill, a child call, and this consumer's
  // call at nearly once): asked for a takeover then, a coordinator that had not yet seen the
  // client go would answer "no takeover" and the request would end UNAVAILABLE, not CANCELLED.
  return absl::IsUnavailable(why) || absl::IsAborted(why);
}

v1::GenerateEvent TransferLostNotice(const std::string& consumer, uint32_t takeover,
                                     int layers_rebuilt, int layers, int64_t token_begin,
                                     size_t prompt_tokens, const std::vector<PlannedChunk>& chunks,
                                     const absl::Status& why) {
  v1::GenerateEvent event;
  event.set_target(consumer);
  v1::TransferLost& lost = *event.mutable_transfer_lost();
  lost.set_layers_rebuilt(static_cast<uint32_t>(layers_rebuilt));
  lost.set_layers(static_cast<uint32_t>(layers));
  lost.set_token_begin(static_cast<uint64_t>(token_begin));
  lost.set_bytes_left(static_cast<uint64_t>(TotalBytes(ChunksFromLayer(chunks, layers_rebuilt))));
  lost.set_bytes_total(static_cast<uint64_t>(TotalBytes(chunks)));
  lost.set_takeover(takeover);
  lost.set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
  lost.set_reason(why.ToString());
  return event;
}

v1::Finished FinishedOf(const PrefixOutcome& prefix, const SequenceEnd& end, size_t prompt_tokens,
                        absl::Time start, absl::Time first_token, absl::Time received,
                        absl::Time now) {
  v1::Finished f;
  f.set_reason(std::string(FinishReasonName(absl::IsCancelled(end.status) ? FinishReason::kCancelled
                                                                          : end.finish_reason)));
  f.set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
  f.set_output_tokens(static_cast<uint32_t>(end.output_tokens));
  f.set_payload_bytes(static_cast<uint64_t>(prefix.payload_bytes));
  SetRanMode(prefix.mode, &f);
  f.set_mode_reason(prefix.reason);
  f.set_consumer_cached_tokens(static_cast<uint32_t>(prefix.cached_tokens));
  f.set_takeovers(prefix.takeovers);
  for (const LoweredLayer& l : prefix.lowered) {
    v1::LoweredLayer* out = f.add_lowered_layers();
    out->set_layer(static_cast<uint32_t>(l.layer));
    out->set_rank_k(static_cast<uint32_t>(l.rank_k));
    out->set_rank_v(static_cast<uint32_t>(l.rank_v));
    out->set_rank_h(static_cast<uint32_t>(l.rank_h));
  }
  v1::Timings* t = f.mutable_timings();
  t->set_queue(Micros(start - received));
  if (prefix.mode == TransferMode::kLocal) {
    t->set_prefill(Micros(end.prefill));
  } else {
    // The last prompt token's steps (most overlapped with the rebuild) and the first sampling.
    t->set_first_decode(Micros(prefix.tail + end.prefill));
  }
  t->set_transfer(Micros(prefix.transfer));
  t->set_rebuild(Micros(prefix.rebuild));
  t->set_patch(Micros(prefix.patch));
  t->set_last_rebuild(Micros(prefix.last_rebuild));
  for (absl::Duration spent : prefix.layer_rebuild) t->add_layer_rebuild(Micros(spent));
  t->set_ttft(first_token == absl::InfinitePast() ? 0 : Micros(first_token - received));
  t->set_total(Micros(now - received));
  return f;
}

absl::Status EndError(const SequenceEnd& end, absl::Duration budget) {
  if (end.status.ok() || absl::IsCancelled(end.status)) return absl::OkStatus();
  if (absl::IsDeadlineExceeded(end.status)) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline of ", absl::FormatDuration(budget), " reached while ",
                     end.first_token == absl::InfinitePast() ? "prefilling" : "decoding"));
  }
  return end.status;
}

v1::GenerateEvent ErrorEvent(const std::string& consumer, const absl::Status& status) {
  v1::GenerateEvent e;
  e.set_target(consumer);
  e.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  e.mutable_error()->set_message(std::string(status.message()));
  return e;
}

}  // namespace scd::consumer
