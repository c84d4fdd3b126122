// LayerwiseRebuilder: the consumer's half of layer-wise streaming. The chunks of one transfer
// arrive one at a time (any order); as soon as a layer holds every chunk the plan sends for it,
// that layer of the consumer's cache is rebuilt (CodeDecoder::DecodeLayer), so rebuilding overlaps
// the rest of the transfer and the producer's remaining prefill. Layers the plan recomputes run
// as soon as their input is there: a run starting at layer 0 from the prefix's own embeddings at
// creation, a later run when the producer's residual stream entering it arrives. A chunk's bytes
// are dropped once its layer is rebuilt. The cache it leaves equals CodeDecoder::Decode's on the
// whole batch, bit for bit.
//
// Pacing: by default a completed layer is rebuilt at once on the calling thread. A consumer that
// batches its decodes (consumer/decode_scheduler.h) hands the work to its scheduler instead
// (RebuildPacing): the scheduler runs each layer's positions in pieces of its choosing between
// two decode steps and tells the rebuilder when they ran; no thread waits meanwhile. A rebuild in
// pieces fills the cache with the same values up to the order of sums inside matrix products of
// other row counts (CodeDecoder's pieces); in one piece it equals the unpaced one bit for bit.
//
// Thread-safety: none; one per transfer, calls serialized by the caller.
#ifndef SCD_CODEC_LAYERWISE_REBUILDER_H_
#define SCD_CODEC_LAYERWISE_REBUILDER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/token_id.h"
#include "codec/code_batch.h"
#include "codec/code_decoder.h"
#include "codec/transfer_plan.h"
#include "model/kv_cache.h"

namespace scd {

// How a rebuild's compute runs (see the file comment).
struct RebuildPacing {
  // A piece of work over rows [begin, begin + count) of a layer's (or recomputed run's) positions.
  using Piece = std::function<absl::Status(int64_t begin, int64_t count)>;
  using Done = std::function<void(absl::Status)>;
  // Runs `work` over rows [0, rows) of `layers` layers in pieces of its choosing, in order,
  // stopping at the first error, then calls `done` with it once (on any thread). Null: one piece,
  // inline, `done` called before Run returns.
  std::function<void(int64_t rows, int layers, Piece work, Done done)> run;

  void Run(int64_t rows, int layers, Piece work, Done done) const {
    if (run) return run(rows, layers, std::move(work), std::move(done));
    done(work(0, rows));
  }
};

class LayerwiseRebuilder {
 public:
  // `plan` is the producer's plan for this transfer (the same mode, producer config, artifact and
  // options give the same plan on both sides); `tokens` are the prefix ids; the codes cover
  // positions [begin, tokens.size()), the cache holds [0, begin) already in every layer (a prefix
  // cache's hit; 0: the cache is empty).
  // REQUIRES: `decoder` and `cache` outlive the rebuilder; `cache` is shaped for the decoder's
  // consumer.
  static absl::StatusOr<std::unique_ptr<LayerwiseRebuilder>> Create(
      const CodeDecoder& decoder, const TransferPlan& plan, std::vector<TokenId> tokens,
      KvCache* cache, int64_t begin = 0, RebuildPacing pacing = {});

  // Told, once, the layers a call filled (ascending; maybe none) or why it failed.
  using Filled = std::function<void(absl::StatusOr<std::vector<int>>)>;

  // Rebuilds what needs nothing from the producer (a recomputed run starting at layer 0, from the
  // prefix's own embeddings); call once, first.
  void Begin(Filled done);
  // Takes one chunk and rebuilds what it completes. Refused (InvalidArgument, naming layer and
  // kind, `done` called at once): a layer outside the plan, a kind the plan does not send for that
  // layer, a second copy of a chunk, a token range other than [begin, T). Calls are serialized:
  // the next one after `done`.
  void Add(CodeChunk chunk, Filled done);

  // Whether every layer of the cache is rebuilt.
  bool complete() const { return remaining_ == 0; }
  // A transfer that ended early continues from another producer (a takeover): the chunks held
  // for layers not yet rebuilt are dropped (they come again), and the rebuild goes on from the
  // first layer not rebuilt, which it returns (the takeover's TransferHeader.layer_begin).
  // FAILED_PRECONDITION when a later layer is rebuilt already (the chunks did not come layer by
  // layer; the caller starts afresh). Not while a call's `done` is due.
  absl::StatusOr<int> Restart();
  // The layers [0, n) rebuilt, in a row from the first.
  int layers_rebuilt() const;
  // OK when complete; else FailedPrecondition naming the chunks still missing (a transfer that
  // ended early must not decode from a half-built cache).
  absl::Status Finish() const;
  // Wall time spent rebuilding so far (Timings.rebuild).
  absl::Duration rebuild_time() const { return rebuild_time_; }
  // The part of it spent on patch layers (aligner + the consumer's own K/V projection;
  // Timings.patch).
  absl::Duration patch_time() const { return patch_time_; }

 private:
  // What a layer waits for before it can be rebuilt.
  struct LayerState {
    std::set<PayloadKind> expected;  // kinds still to arrive
    std::map<PayloadKind, CodeChunk> held;
    int run_end = -1;  // > 0: this layer starts a recomputed run [layer, run_end)
    bool done = false;
  };
  LayerwiseRebuilder(const CodeDecoder& decoder, std::vector<TokenId> tokens, KvCache* cache,
                     int64_t begin, RebuildPacing pacing);
  // Runs `work` over `rows` positions through the pacing, timing its compute.
  void RunPieces(int64_t rows, int layers, RebuildPacing::Piece work, RebuildPacing::Done done);
  // Rebuilds `layer` from its held chunks (and its recomputed run); tells `done` the layers filled.
  void Rebuild(int layer, Filled done);
  // The work of a recomputed run [layer, end), and of a layer decoded from its chunks.
  RebuildPacing::Piece RecomputePiece(int layer, int end);
  RebuildPacing::Piece DecodePiece(int layer, int64_t rows);

  const CodeDecoder& decoder_;
  const std::vector<TokenId> tokens_;
  KvCache* cache_;
  const int64_t begin_;  // positions the cache held before the transfer
  const RebuildPacing pacing_;
  std::vector<LayerState> layers_;
  int remaining_ = 0;  // layers of the cache not yet filled
  absl::Duration rebuild_time_;
  absl::Duration patch_time_;
};

}  // namespace scd

#endif  // SCD_CODEC_LAYERWISE_REBUILDER_H_
