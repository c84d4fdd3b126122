// Layer-wise rebuilding on the consumer: receives one transfer session's chunks and rebuilds each
// cache layer as soon as its chunks are in (LayerwiseRebuilder), so rebuilding overlaps the
// transfer and the producer's prefill. The header is checked against what this consumer expects
// first (mode, prefix length, the exact chunks its plan implies) and the session is cancelled,
// naming the difference, when it does not match; a chunk that does not unframe or rebuild cancels
// it too. Every chunk must be one the plan sends, of its shape; under an adaptive header a code
// chunk may come at a lower rank (its first columns: the nested codes), and the cache is
// rebuilt from what arrived. The cache is complete exactly when this returns OK.
// Thread-safety: ReceiveIntoCache may run concurrently for distinct sessions and caches.
#ifndef SCD_CONSUMER_CODE_RECEIVER_H_
#define SCD_CONSUMER_CODE_RECEIVER_H_

#include <atomic>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/cancellation.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/layerwise_rebuilder.h"
#include "model/layer_stepper.h"
#include "transport/transfer_session.h"

namespace scd::consumer {

// A layer whose codes arrived below the plan's ranks (an adaptive transfer whose link fell behind,
// TransferHeader.adaptive): the ranks that arrived, 0 for a code that came at the plan's rank or
// that the layer does not carry.
struct LoweredLayer {
  int layer = 0;
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;  // the lowest rank of the layer's pieces
};

// One piece of positions of a code that arrived below the plan's rank.
struct LoweredPiece {
  int layer = 0;
  PayloadKind kind = PayloadKind::kKeyCode;
  int64_t token_begin = 0, token_end = 0;
  int64_t rank = 0;
};

struct ReceiveReport {
  absl::Time first_chunk = absl::InfinitePast();
  absl::Time last_chunk = absl::InfinitePast();
  absl::Time first_layer_ready = absl::InfinitePast();  // first cache layer rebuilt
  absl::Duration rebuild;                               // summed time rebuilding
  absl::Duration patch;                                 // of which patch layers
  // The unframing and rebuilding the last chunk set off (the last layer's): what the transfer
  // cannot hide. Waiting for the producer's trailer afterwards is not counted.
  absl::Duration last_rebuild;
  // The tail token's layer steps (its part of rebuild-time work, overlapped the same way).
  absl::Duration tail;
  int64_t bytes = 0;  // data and scales received (the header's expected_bytes when complete)
  int64_t chunks = 0;
  std::vector<LoweredLayer> lowered;  // ascending layers; empty when the plan's ranks arrived
  std::vector<LoweredPiece> lowered_pieces;  // in arrival order
};

// `expected` are the chunks the producer's plan sends for `tokens` (CodeEncoder::PlannedChunks of
// the same mode, producer config, artifact and options); `decoder` holds the consumer model and
// its artifact. The transfer covers positions [begin, tokens.size()) (`expected` planned for that
// many); `cache` holds [0, begin) in every layer (a prefix cache's hit; 0: empty). On any error the
// session ends (cancelled) and the cache must be discarded. `cancellation` (may be null), once
// cancelled, ends the session at once (CANCELLED): the producer hears it and stops sending. `tail`
// (may be null; started for the prompt token after `tokens`, at position tokens.size()) is advanced
// through each layer as soon as that layer is rebuilt, so when this returns OK it has been through
// every layer and the cache holds the prompt's last position too. `pacing` says where the rebuild's
// and the tail's compute runs (codec/layerwise_rebuilder.h: the consumer's scheduler, between
// decode steps). A session with no chunk for `stall_timeout` ends DEADLINE_EXCEEDED (a producer
// that stalls).
absl::StatusOr<ReceiveReport> ReceiveIntoCache(
    transport::ReceiveSession& session, const CodeDecoder& decoder, const TransferPlan& plan,
    const std::vector<PlannedChunk>& expected, const std::vector<TokenId>& tokens, KvCache* cache,
    absl::Duration timeout, Cancellation* cancellation = nullptr, int64_t begin = 0,
    LayerStepper* tail = nullptr, const RebuildPacing& pacing = {},
    absl::Duration stall_timeout = absl::InfiniteDuration());

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_CODE_RECEIVER_H_
