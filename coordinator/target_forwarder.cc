#include "coordinator/target_forwarder.h"

#include <utility>

#include "proto/wire_mode.h"

namespace scd::coordinator {

TargetForwarder::TargetForwarder(const Route* route, size_t index, NodeRegistry* registry)
    : route_(route), index_(index), registry_(registry) {}

bool TargetForwarder::NeedsProducer(const v1::GenerateEvent& event) const {
  return event.has_finished() && RanMode(event.finished()) != TransferMode::kLocal &&
         started_mode_ != TransferMode::kLocal;
}

void TargetForwarder::MoveTo(const Route* route, size_t index, std::string from_node,
                             std::string reason) {
  route_ = route;
  index_ = index;
  ++moves_;
  move_pending_ = started_;  // a stream not started yet: the new replica's Started is its Started
  started_mode_ = TransferMode::kLocal;  // a move prefills locally: no codes for it
  consumer_cached_tokens_ = 0;
  first_token_ = false;
  moved_from_ = std::move(from_node);
  move_reason_ = std::move(reason);
}

void TargetForwarder::Resume(std::vector<int32_t> received, TransferMode started,
                             std::string reason) {
  streamed_ids_ = std::move(received);
  decoded_locally_ = started == TransferMode::kLocal;
  move_pending_ = true;
  resumed_ = true;
  moved_from_.clear();
  move_reason_ = std::move(reason);
}

void TargetForwarder::ToMoved(v1::GenerateEvent* event) {
  started_ = true;  // a resume's first Started
  started_mode_ = RanMode(event->started());
  decoding_mode_ = started_mode_;
  consumer_cached_tokens_ = event->started().consumer_cached_tokens();
  v1::GenerateEvent moved;
  moved.set_target(target().target);
  v1::Moved* m = moved.mutable_moved();
  m->set_tokens_so_far(static_cast<uint32_t>(streamed_ids_.size()));
  m->set_from_node(moved_from_);
  m->set_to_node(target().consumer_node);
  m->set_reason(move_reason_);
  m->set_moves(moves_);
  m->set_resumed(resumed_);
  *event = std::move(moved);
  move_pending_ = false;
  resumed_ = false;
}

bool TargetForwarder::Rewrite(const ProducerOutcome& producer, v1::GenerateEvent* event) {
  event->set_target(target().target);
  if (move_pending_ && event->has_started()) {
    ToMoved(event);
    return true;
  }
  if (NeedsProducer(*event)) {
    // The producer's side of the breakdown: its Prefill answer normally precedes the consumer's
    // Finished (it returns at the transfer's ack).
    v1::Finished* finished = event->mutable_finished();
    finished->mutable_timings()->set_prefill(producer.prefill_us);
    finished->mutable_timings()->set_encode(producer.encode_us);
    finished->mutable_timings()->clear_layer_codes();
    for (uint64_t at : producer.layer_codes_us) finished->mutable_timings()->add_layer_codes(at);
    if (producer.link.has_value()) *finished->mutable_link() = *producer.link;
    finished->set_producer_cached_tokens(producer.cached_tokens);
  }
  if (event->has_started()) {
    if (started_) {  // the consumer fell back to its own prefill (control.proto): noted only
      fell_back_ = true;
      decoding_mode_ = TransferMode::kLocal;
      return false;
    }
    started_ = true;
    started_mode_ = RanMode(event->started());
    decoding_mode_ = started_mode_;
    consumer_cached_tokens_ = event->started().consumer_cached_tokens();
    early_declined_ = event->started().early_prefill_declined();
    event->mutable_started()->clear_early_prefill_declined();
    if (started_mode_ != TransferMode::kLocal) {
      event->mutable_started()->set_producer_cached_tokens(route_->producer_cached_tokens);
    }
  }
  if (event->has_finished()) {
    v1::Finished* finished = event->mutable_finished();
    finished->set_moves(moves_);
    // Auto's prediction, where the mode it predicted for is the one that ran.
    const TransferMode ran = RanMode(*finished);
    if (target().predicted_ttft_us > 0 && ran == target().mode) {
      finished->set_predicted_ttft_us(static_cast<uint64_t>(target().predicted_ttft_us));
    }
    if (registry_ != nullptr) registry_->ObserveFinished(*route_, target(), *finished);
  }
  if (event->has_token()) {
    streamed_ids_.insert(streamed_ids_.end(), event->token().ids().begin(),
                         event->token().ids().end());
    if (decoding_mode_ != TransferMode::kLocal && event->token().ids_size() > 0) {
      decoded_locally_ = false;
    }
  }
  if (event->has_token() && !first_token_) {
    first_token_ = true;
    if (registry_ != nullptr) registry_->NoteFirstToken(*route_, index_);  // its prefill ended
  }
  if (event->has_finished() || event->has_error()) terminal_ = true;
  return true;
}

}  // namespace scd::coordinator
