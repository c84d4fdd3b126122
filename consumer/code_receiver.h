// Layer-wise rebuilding on the consumer: receives one transfer session's chunks and rebuilds each
// cache layer as soon as its chunks are in (LayerwiseRebuilder), so rebuilding overlaps the
// transfer and the producer's prefill. The header is checked against what this consumer expects
// first (mode, prefix length, the exact chunks its plan implies) and the session is cancelled,
// naming the difference, when it does not match; a chunk that does not unframe or rebuild cancels
// it too. Every chunk must be one the plan sends, of its shape; under an adaptive header a code
// chunk may come at a lower rank (its first columns: the nested codes), and the cache is
// rebuilt from what arrived. The cache is complete exactly when the result is OK.
//
// A receive holds no thread: it is a state object advanced by events -- the session has a chunk
// (ReceiveSession::OnReady; taking it runs as a job on the caller's queue: the CRC, unframing,
// the checks), a rebuild's pieces ran (RebuildPacing: the consumer's scheduler, between decode
// steps), a timer (the stall and the deadline, on the clock), a cancellation.
// Thread-safety: ReceiveIntoCache may run concurrently for distinct sessions and caches; one
// receive's steps never run concurrently.
#ifndef SCD_CONSUMER_CODE_RECEIVER_H_
#define SCD_CONSUMER_CODE_RECEIVER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/cancellation.h"
#include "base/clock.h"
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
  // Per layer (index = layer): the rebuild that layer's chunks set off (Timings.layer_rebuild).
  std::vector<absl::Duration> layer_rebuild;
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

// What a receive built so far, kept across a takeover (another producer sending the rest of a
// transfer whose producer was lost, TransferHeader.layer_begin): the rebuilder, with the layers
// rebuilt, and the report so far. The caller owns it; a receive given one with a rebuilder
// continues it (the header must say layer_begin = the first layer not rebuilt).
struct ReceiveProgress {
  std::unique_ptr<LayerwiseRebuilder> rebuilder;  // null until a receive began rebuilding
  ReceiveReport report;
  // Layers [0, layers_rebuilt()) are rebuilt (0 with no rebuilder).
  int layers_rebuilt() const;
};

// How a receive runs, beside what it receives.
struct ReceiveOptions {
  absl::Time deadline = absl::InfiniteFuture();  // every chunk rebuilt by then
  // A session with no chunk for this long ends DEADLINE_EXCEEDED (a producer that stalls); the
  // time a chunk's rebuild takes does not count.
  absl::Duration stall_timeout = absl::InfiniteDuration();
  // Once cancelled, ends the session at once (CANCELLED): the producer hears it and stops sending.
  Cancellation* cancellation = nullptr;  // may be null
  int64_t begin = 0;  // positions [0, begin) the cache holds already (a prefix cache's hit)
  // Started for the prompt token after `tokens` (at position tokens.size()); advanced through each
  // layer as soon as that layer is rebuilt, so at OK it has been through every layer and the cache
  // holds the prompt's last position too. May be null.
  LayerStepper* tail = nullptr;
  // Where the rebuild's and the tail's compute runs (the consumer's scheduler; null: inline).
  RebuildPacing pacing;
  // Runs the receive's own steps (a WorkQueue's Run): never on the transport's threads, the
  // scheduler's or the clock's. Required.
  std::function<void(std::function<void()>)> post;
  Clock* clock = nullptr;  // the stall and the deadline; null: Clock::Real()
  // Where the rebuild and the report live (null: the receive's own): a receive that fails
  // leaves in it what it rebuilt, for a takeover's receive to continue (ReceiveProgress).
  std::shared_ptr<ReceiveProgress> progress = nullptr;
};

// Told once how a receive ended (on the thread of its last step).
using ReceiveDone = std::function<void(absl::StatusOr<ReceiveReport>)>;

// Receives `session` into `cache` and tells `done`. `expected` are the chunks the producer's plan
// sends for `tokens` (CodeEncoder::PlannedChunks of the same mode, producer config, artifact and
// options) over positions [options.begin, tokens.size()) -- a takeover's of its layers only
// (ChunksFromLayer); `decoder` holds the consumer model and its artifact. On any error the
// session ends (cancelled) and the cache must be discarded, or continued by a takeover's receive
// with the same options.progress, cache, tail and decoder.
// REQUIRES: `decoder`, `plan`, `expected`, `tokens`, `cache`, options.tail and
// options.cancellation outlive `done`.
void ReceiveIntoCache(std::shared_ptr<transport::ReceiveSession> session,
                      const CodeDecoder& decoder, const TransferPlan& plan,
                      const std::vector<PlannedChunk>& expected, const std::vector<TokenId>& tokens,
                      KvCache* cache, ReceiveOptions options, ReceiveDone done);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_CODE_RECEIVER_H_
