#include "codec/transfer.h"

#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "codec/code_batch_wire.h"

namespace scd {

CodeBatchHandOff InProcessHandOff() {
  return [](CodeBatch batch) -> absl::StatusOr<CodeBatch> { return batch; };
}

CodeBatchHandOff WireHandOff() {
  return [](CodeBatch batch) -> absl::StatusOr<CodeBatch> {
    return ParseCodeBatch(SerializeCodeBatch(batch));
  };
}

absl::StatusOr<TransferStats> RunTransfer(const LlamaModel& producer, const CodeEncoder& encoder,
                                          absl::Span<const TokenId> prefix,
                                          const CodeBatchHandOff& hand_off,
                                          const CodeDecoder& decoder, KvCache* cache) {
  return GuardExceptions("RunTransfer", [&]() -> absl::StatusOr<TransferStats> {
    TransferStats stats;
    Stopwatch watch;
    SCD_ASSIGN_OR_RETURN(CodeBatch sent, encoder.Prefill(producer, prefix));
    stats.payload_bytes = sent.bytes();
    stats.tokens = sent.tokens;
    stats.encode_seconds = watch.Lap();
    SCD_ASSIGN_OR_RETURN(CodeBatch received, hand_off(std::move(sent)));
    stats.hand_off_seconds = watch.Lap();
    SCD_RETURN_IF_ERROR(decoder.Decode(received, prefix, cache));
    stats.decode_seconds = watch.Lap();
    return stats;
  });
}

absl::StatusOr<TransferPath> TransferPath::Create(TransferMode mode, const LlamaModel& producer,
                                                  const LlamaModel& consumer,
                                                  const Artifact* artifact,
                                                  const TransferOptions& options) {
  SCD_ASSIGN_OR_RETURN(TransferPlan plan,
                       TransferPlan::Make(mode, producer.config(), artifact, options));
  return TransferPath(producer, std::make_shared<CodeEncoder>(std::move(plan), artifact, options),
                      std::make_shared<CodeDecoder>(consumer, artifact));
}

absl::StatusOr<TransferStats> TransferPath::Run(absl::Span<const TokenId> prefix, KvCache* cache,
                                                const CodeBatchHandOff& hand_off) const {
  return RunTransfer(*producer_, *encoder_, prefix, hand_off, *decoder_, cache);
}

}  // namespace scd
