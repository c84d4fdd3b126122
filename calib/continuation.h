// CompareContinuations (scd-calib generate): the consumer continues a prompt from its own
// prefill and from a cache rebuilt out of what the producer sent in each mode, through the one
// transfer path (codec/transfer.h). Greedy by default, so the continuations are comparable.
// Thread-safety: stateless function; uses the models read-only.
#ifndef SCD_CALIB_CONTINUATION_H_
#define SCD_CALIB_CONTINUATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calib/model_pair.h"
#include "codec/artifact.h"
#include "codec/transfer.h"
#include "model/generator.h"

namespace scd {

struct ContinuationOptions {
  std::string prompt;
  std::vector<TransferMode> modes = {TransferMode::kScd};
  TransferOptions transfer;
  GenerationOptions generation;
  // How the batch reaches the consumer (default: in process).
  CodeBatchHandOff hand_off = InProcessHandOff();
};

struct Continuation {
  TransferMode mode = TransferMode::kLocal;  // kLocal: the consumer's own prefill
  std::string text;                          // prompt + continuation
  std::vector<TokenId> output_ids;
  double bytes_per_token = 0;
  double payload_ratio = 0;    // of the consumer's raw f16 KV
  size_t agreeing_tokens = 0;  // leading tokens equal to the own-prefill continuation
};

struct ContinuationReport {
  std::vector<TokenId> prompt_ids;
  std::vector<Continuation> runs;  // own prefill first, then one per mode
};

// `artifact` may be null for modes that need none.
absl::StatusOr<ContinuationReport> CompareContinuations(const ModelPair& pair,
                                                        const Artifact* artifact,
                                                        const ContinuationOptions& options);

std::string FormatContinuations(const ContinuationReport& report, const std::string& consumer_name,
                                const std::string& prompt);

}  // namespace scd

#endif  // SCD_CALIB_CONTINUATION_H_
