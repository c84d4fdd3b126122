// PairedTraces: what calibration keeps from paired prefills of the producer and the consumer on
// the same prefixes. Per layer: streaming Gram statistics of pre-RoPE keys and values (one per kv
// head; a shared map merges them) and of attention inputs, plus a bounded uniform reservoir of
// attention-input pairs for aligner training. Memory does not grow with the number of prefixes.
// Thread-safety: not thread-safe.
#ifndef SCD_CALIB_PAIRED_TRACES_H_
#define SCD_CALIB_PAIRED_TRACES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "codec/gram_stats.h"
#include "model/llama_model.h"

namespace scd {

class PairedTraces {
 public:
  // `reservoir_rows`: attention-input pairs kept per layer (uniform sample of all rows seen).
  PairedTraces(const ModelConfig& producer, const ModelConfig& consumer, int64_t reservoir_rows,
               uint64_t seed);

  // One prefix: captures of both models over the same tokens.
  absl::Status Add(const Captures& producer, const Captures& consumer);

  int layers() const { return static_cast<int>(keys_.size()); }
  int64_t rows_seen() const { return rows_seen_; }
  const std::vector<GramStats>& key_grams(int layer) const { return keys_[layer]; }
  const std::vector<GramStats>& value_grams(int layer) const { return values_[layer]; }
  const GramStats& hidden_grams(int layer) const { return hidden_[layer]; }
  // Reservoir of attention inputs, [n, hidden] each, rows paired.
  at::Tensor hidden_a(int layer) const;
  at::Tensor hidden_b(int layer) const;

  // All heads' statistics merged: the input of a map shared by the heads of a layer.
  static GramStats Merged(const std::vector<GramStats>& per_head);

 private:
  std::vector<std::vector<GramStats>> keys_, values_;  // [layer][kv head]
  std::vector<GramStats> hidden_;
  int64_t capacity_;
  int64_t rows_seen_ = 0;  // token rows per layer so far
  int64_t kept_ = 0;
  std::vector<at::Tensor> reservoir_a_, reservoir_b_;  // [capacity, hidden] per layer
  std::mt19937_64 rng_;
};

}  // namespace scd

#endif  // SCD_CALIB_PAIRED_TRACES_H_
