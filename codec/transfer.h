// The producer -> consumer step, written once: the producer prefills and encodes a CodeBatch,
// a hand-off carries it to the consumer side, the consumer decodes it into its own KV cache.
// Evaluation, calibration, `scd-calib generate` and the services all go through RunTransfer;
// they differ only in the hand-off (in-process, the serialized wire form, a transport, or a
// fault-injecting wrapper in tests).
// Thread-safety: RunTransfer is reentrant; a TransferPath is immutable after Create() and Run
// may be called concurrently with distinct caches (as long as the hand-off allows it).
#ifndef SCD_CODEC_TRANSFER_H_
#define SCD_CODEC_TRANSFER_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/transfer_plan.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace scd {

// Moves a batch from the producer's side to the consumer's; returns what the consumer receives.
using CodeBatchHandOff = std::function<absl::StatusOr<CodeBatch>(CodeBatch batch)>;

// The batch itself, moved (no copy): the all-in-one process and offline evaluation.
CodeBatchHandOff InProcessHandOff();
// Through the checked wire form (codec/code_batch_wire.h): serialized, then parsed, as a
// transport would deliver it. Bit-identical to InProcessHandOff for any valid batch.
CodeBatchHandOff WireHandOff();

struct TransferStats {
  int64_t payload_bytes = 0;  // CodeBatch::bytes() as sent
  int64_t tokens = 0;         // prefix positions covered
  double encode_seconds = 0;  // producer prefill + encode
  double hand_off_seconds = 0;
  double decode_seconds = 0;  // consumer cache rebuild
};

// Encodes `prefix` with the producer, hands the batch over, decodes it into `cache` (empty, the
// consumer's). REQUIRES: the encoder and decoder were made for the same plan and artifact.
absl::StatusOr<TransferStats> RunTransfer(const LlamaModel& producer, const CodeEncoder& encoder,
                                          absl::Span<const TokenId> prefix,
                                          const CodeBatchHandOff& hand_off,
                                          const CodeDecoder& decoder, KvCache* cache);

// An encoder and a decoder made for one mode, pair and artifact: what an in-process caller
// needs to run transfers.
class TransferPath {
 public:
  // REQUIRES: the models and `artifact` (may be null for modes without one) outlive the path.
  static absl::StatusOr<TransferPath> Create(TransferMode mode, const LlamaModel& producer,
                                             const LlamaModel& consumer, const Artifact* artifact,
                                             const TransferOptions& options);

  absl::StatusOr<TransferStats> Run(absl::Span<const TokenId> prefix, KvCache* cache,
                                    const CodeBatchHandOff& hand_off = InProcessHandOff()) const;

  const TransferPlan& plan() const { return encoder_->plan(); }

 private:
  TransferPath(const LlamaModel& producer, std::shared_ptr<const CodeEncoder> encoder,
               std::shared_ptr<const CodeDecoder> decoder)
      : producer_(&producer), encoder_(std::move(encoder)), decoder_(std::move(decoder)) {}

  const LlamaModel* producer_;
  std::shared_ptr<const CodeEncoder> encoder_;
  std::shared_ptr<const CodeDecoder> decoder_;
};

}  // namespace scd

#endif  // SCD_CODEC_TRANSFER_H_
