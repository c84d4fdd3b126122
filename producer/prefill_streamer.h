// Layer-wise streaming on the producer: one prefill whose layers are encoded and sent, each to
// every target's transfer session, as soon as the forward pass has computed them
// (ForwardOptions::on_layer), so transfer overlaps prefill. A fan-out request has several targets
// (each with its own encoder: its own artifact and mode) and still runs one prefill. The pass
// ends once the last layer's codes are out: that layer's attention and MLP feed nothing.
//
// A target whose session ends early (consumer gone, cancelled, deadline) is dropped and the others
// go on; when every target is gone the prefill stops at the next layer. Every chunk's bytes are a
// view of the encoder's tensor, released once the transport has sent them.
// Thread-safety: StreamPrefill may run concurrently for distinct sessions.
#ifndef SCD_PRODUCER_PREFILL_STREAMER_H_
#define SCD_PRODUCER_PREFILL_STREAMER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "codec/code_encoder.h"
#include "codec/rank_governor.h"
#include "model/llama_model.h"
#include "producer/prefix_store.h"
#include "proto/code_chunk_framing.h"
#include "transport/transfer_session.h"

namespace scd::producer {

// The header announcing what `encoder` will stream for a prefill of `tokens` positions of
// `producer` (sent before the first layer exists): positions [begin, tokens), the consumer
// holding the rest (its prefix cache); a takeover's chunks of layers [layer_begin, layers) only
// (TransferHeader.layer_begin).
absl::StatusOr<v1::TransferHeader> StreamHeader(const CodeEncoder& encoder,
                                                const ModelConfig& producer, int64_t tokens,
                                                const TransferIdentity& identity, int64_t begin = 0,
                                                int layer_begin = 0);

struct StreamTarget {
  const CodeEncoder* encoder = nullptr;             // not owned
  std::shared_ptr<transport::SendSession> session;  // header sent (StartSession)
  int64_t begin = 0;  // the first position sent (its header's token_begin)
  // The encoding's CodesKey: with a prefix cache, codes kept for cached blocks under this key are
  // sent as they are, and the codes this prefill encodes are handed back (PrefixReuse::codes).
  // Empty: always encode, keep nothing.
  std::string codes_key = {};
  // With a budget: code chunks go at lower nested ranks when the link falls behind it
  // (codec/rank_governor.h), in pieces of positions handed over by an AdaptiveSender only when
  // the link is ready for each, so every piece's ranks are chosen when it goes; the pass is not
  // held by the link. Its header must say `adaptive`.
  AdaptBudget adapt = {};
  size_t adapt_max_window = 0;  // AdaptiveSender::Options::max_window (0: its default)
  // A takeover (PrefillTarget.layer_begin): the pass runs every layer, this target gets the codes
  // of layers [layer_begin, layers) only (its header's layer_begin). Not with `adapt` or a
  // `codes_key`.
  int layer_begin = 0;
};

// A prefill that starts from the producer's prefix cache: positions [0, cached->tokens) are
// loaded, not computed, and their codes are encoded from the cached blocks.
struct PrefixReuse {
  const ProducerPrefixStore* store = nullptr;  // not owned
  const CachedPrefix* cached = nullptr;        // not owned
  // When set, receives the forward pass's captures (store->capture()'s kinds, positions
  // [cached->tokens, T)) per layer, for ProducerPrefixStore::Store once the prefill succeeded.
  std::map<int, LayerCapture>* keep = nullptr;
  // When set, resized to the targets and filled per target with the chunks this prefill encoded
  // (not those served from kept codes), for ProducerPrefixStore::AddCodes.
  std::vector<EncodedRun>* codes = nullptr;
};

struct StreamReport {
  absl::Time start;
  absl::Time prefill_end;  // the forward pass's last layer's codes sent (where the pass ends)
  absl::Time first_chunk;  // first chunk handed to a session (InfinitePast: none)
  absl::Duration encode;   // summed over layers and targets
  // Time the pass spent handing chunks to sessions (a session short of credit holds it: the
  // link's time, not the pass's), summed.
  absl::Duration send;
  int64_t bytes = 0;       // payload bytes handed to sessions, all targets
  int64_t chunks = 0;
  int layers_run = 0;
  // Per layer the pass reached: when its codes were out (encoded for every live target and handed
  // to the sessions or their senders), from `start` (PrefillResponse.layer_codes_us).
  std::vector<absl::Duration> layer_codes;
  int64_t cached_tokens = 0;    // positions loaded from the prefix cache
  int64_t computed_tokens = 0;  // positions a complete forward pass ran (0 when cut short)
  int64_t code_hit_tokens = 0;  // positions sent from kept codes, summed over targets
  // Every layer's captures were taken over every position (nothing cut short; the last layer
  // runs no further than that).
  bool forward_complete = false;
  std::vector<absl::Status> targets;  // per target: OK (acked) or why it ended
  // Per target: the layers sent below the plan's ranks (an adapting target whose link fell
  // behind), ascending.
  std::vector<std::vector<int>> lowered;
};

// Runs `producer` over `tokens` once, streaming to every target, then finishes each live session
// (trailer, ack). Returns an error only when the prefill itself fails (then every session is
// cancelled with that reason); per-target outcomes are in the report. `held_payload_bytes` (may be
// null) counts the code bytes handed to the transport and not yet released by it (up while a
// chunk waits or travels, down once the transport lets go of it).
// `reuse` (may be null): start from a cached prefix.
absl::StatusOr<StreamReport> StreamPrefill(const LlamaModel& producer,
                                           absl::Span<const TokenId> tokens,
                                           const std::vector<StreamTarget>& targets,
                                           std::atomic<uint64_t>* held_payload_bytes = nullptr,
                                           const PrefixReuse* reuse = nullptr);

}  // namespace scd::producer

#endif  // SCD_PRODUCER_PREFILL_STREAMER_H_
