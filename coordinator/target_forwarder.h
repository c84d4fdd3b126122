// One target's event stream on the coordinator: rewrites what its consumer's Consumer.Decode
// sends into the client's GenerateEvents. It names the event's target, adds the producer's side
// of a transfer to its Finished (prefill, encode, link, cached tokens: ProducerOutcome), the
// producer's cached tokens to a Started from codes and auto's prediction to a Finished in the
// mode it predicted for; it tells the registry what the target's progress means for routing (its
// first token ends the prefill's load, a Finished from codes teaches the link), and drops the
// consumer's fallback notice (a second Started, control.proto), noting it. A stream that moves to
// another replica (MoveTo) keeps its forwarder: the new replica's Started becomes the client's
// Moved event, and its Finished says how many moves there were.
// Thread-safety: not thread-safe; the caller serializes (one stream's events come in order).
#ifndef SCD_COORDINATOR_TARGET_FORWARDER_H_
#define SCD_COORDINATOR_TARGET_FORWARDER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/transfer_mode.h"
#include "coordinator/node_registry.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd::coordinator {

// The producer's side of a routed request, as its Prefill answer said.
struct ProducerOutcome {
  bool known = false;  // it answered, or there is no producer call
  uint64_t prefill_us = 0, encode_us = 0;
  std::vector<uint64_t> layer_codes_us;  // per layer: its codes out, from the pass's start
  uint32_t cached_tokens = 0;         // prompt positions its cache served
  std::optional<v1::LinkShape> link;  // the shape its sessions travelled under
};

class TargetForwarder {
 public:
  // `route` (and `registry`, which may be null: nothing noted) outlive the forwarder; `index`:
  // the target's place in route->targets.
  TargetForwarder(const Route* route, size_t index, NodeRegistry* registry);

  // Whether `event` is a Finished from codes, whose breakdown needs the producer's outcome: the
  // caller waits for the producer's answer (briefly) before Rewrite.
  bool NeedsProducer(const v1::GenerateEvent& event) const;
  // Rewrites `event` for the client; false: not forwarded (the consumer's fallback notice).
  bool Rewrite(const ProducerOutcome& producer, v1::GenerateEvent* event);

  const RouteTarget& target() const { return route_->targets[index_]; }
  bool started() const { return started_; }
  // The consumer announced that it fell back to its own prefill.
  bool fell_back() const { return fell_back_; }
  // The target's terminal event (Finished, Error) passed, or the caller wrote one for it.
  bool terminal() const { return terminal_; }
  void set_terminal() { terminal_ = true; }
  // As its Started said (local until then).
  TransferMode started_mode() const { return started_mode_; }
  // Prompt positions the consumer's own prefix cache held (its Started said).
  uint32_t consumer_cached_tokens() const { return consumer_cached_tokens_; }
  // Its Started said that it declined the early prefill (Started.early_prefill_declined, which
  // Rewrite clears: the client never sees it).
  bool early_declined() const { return early_declined_; }
  // The output token ids forwarded so far (what a moved stream continues from).
  const std::vector<int32_t>& streamed_ids() const { return streamed_ids_; }
  // Every id in streamed_ids() was decoded on a cache its replica prefilled itself (local mode,
  // a fallback's included; a resume's as its token says): DecodeRequest.continued_mode LOCAL.
  bool decoded_locally() const { return decoded_locally_; }
  uint32_t moves() const { return moves_; }
  // A move made (MoveTo) whose new replica's Started has not come yet.
  bool move_pending() const { return move_pending_; }
  // The stream goes on at `route`'s target `index` (a replica that continues it; `route` outlives
  // the forwarder): its Started becomes a Moved event from `from_node` saying `reason` -- or,
  // for a stream whose Started had not come yet, the client's Started (the move is counted in
  // Finished.moves only).
  void MoveTo(const Route* route, size_t index, std::string from_node, std::string reason);
  // The stream resumes here after `received` output ids its client got through another
  // coordinator (GenerateRequest.resume_token): its Started becomes the client's Moved event
  // (resumed, saying `reason`), and it counts no move. `started` is the mode the token says the
  // stream started in: only a local start (which never moves to codes) decoded them locally.
  void Resume(std::vector<int32_t> received, TransferMode started, std::string reason);

 private:
  // The Moved event that stands for a moved stream's new Started.
  void ToMoved(v1::GenerateEvent* event);

  const Route* route_;
  size_t index_;
  NodeRegistry* const registry_;
  bool started_ = false, fell_back_ = false, terminal_ = false, first_token_ = false;
  TransferMode started_mode_ = TransferMode::kLocal;
  uint32_t consumer_cached_tokens_ = 0;
  bool early_declined_ = false;
  std::vector<int32_t> streamed_ids_;
  // The mode the current replica decodes in (its Started's; local after its fallback notice),
  // and whether every streamed id so far was decoded locally.
  TransferMode decoding_mode_ = TransferMode::kLocal;
  bool decoded_locally_ = true;
  uint32_t moves_ = 0;
  bool move_pending_ = false;  // the new replica's Started not seen yet
  bool resumed_ = false;       // ... and it is a resume's
  std::string moved_from_, move_reason_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_TARGET_FORWARDER_H_
