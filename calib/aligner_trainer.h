// Trains a PatchAligner's MLP (the nonlinear correction on top of the basis's linear decode) on
// paired attention inputs, with Adam, minibatches, a warmup + cosine learning-rate schedule and
// early stopping on a held-out split; the best held-out weights are kept.
// The loss is measured where it matters to the consumer: on (H_hat - H_B) [W_k; W_v]^T, the
// error of the K and V the consumer regenerates (or on H itself with Loss::kHidden).
// Thread-safety: stateless function (uses libtorch's global thread pool).
#ifndef SCD_CALIB_ALIGNER_TRAINER_H_
#define SCD_CALIB_ALIGNER_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "codec/patch_aligner.h"
#include "codec/reuse_translator.h"

namespace scd {

struct AlignerTrainOptions {
  AlignerShape shape;
  enum class Loss { kKeyValue, kHidden } loss = Loss::kKeyValue;
  int64_t batch = 512;
  double lr = 3e-3;
  double weight_decay = 0.0;
  int max_epochs = 60;
  int patience = 8;      // epochs without held-out improvement before stopping
  double holdout = 0.1;  // share of rows held out
  // Wall-clock budget per aligner; 0 = none. A budget makes the fit depend on the machine's speed
  // (fewer epochs on a slower or busier machine), so reproducible fits pass 0.
  double max_seconds = 60;
  uint64_t seed = 0;
  // Nested codes (a frontier's lower points send fewer hidden-code columns): half the training
  // rows of every minibatch keep only their first r' columns, r' uniform in
  // [nested_min_rank, rank], the rest read as zero, as the consumer reads a truncated code; the
  // target is then what the linear decode of the truncated code leaves over. Held-out loss (early
  // stopping, the report) is the mean over r in {nested_min_rank, midway, rank}. 0: off (trained
  // at the full rank only; a truncated code then costs far more than its dropped columns); at or
  // above the code's rank there is nothing to truncate, so also off.
  int64_t nested_min_rank = 0;
};

struct AlignerTrainReport {
  int64_t train_rows = 0, heldout_rows = 0;
  double linear_heldout = 0;  // held-out loss of the linear decode alone
  double heldout = 0;         // best held-out loss with the MLP
  int epochs = 0;
  double seconds = 0;
};

// h_a, h_b: [n, hidden] paired attention inputs. kv_weight: the consumer's [W_k; W_v],
// [2 kv_dim, hidden] (used by the key-value loss). `on_epoch(epoch, heldout)` reports progress.
absl::StatusOr<PatchAligner> TrainAligner(const ReuseTranslator& basis, const at::Tensor& h_a,
                                          const at::Tensor& h_b, const at::Tensor& kv_weight,
                                          const AlignerTrainOptions& options,
                                          AlignerTrainReport* report,
                                          const std::function<void(int, double)>& on_epoch = {});

}  // namespace scd

#endif  // SCD_CALIB_ALIGNER_TRAINER_H_
