#include "calib/paired_traces.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace scd {

PairedTraces::PairedTraces(const ModelConfig& producer, const ModelConfig& consumer,
                           int64_t reservoir_rows, uint64_t seed)
    : capacity_(reservoir_rows), rng_(seed) {
  for (int64_t l = 0; l < consumer.num_layers; ++l) {
    keys_.emplace_back(consumer.num_kv_heads, GramStats(producer.head_dim, consumer.head_dim));
    values_.emplace_back(consumer.num_kv_heads, GramStats(producer.head_dim, consumer.head_dim));
    hidden_.emplace_back(producer.hidden_size, consumer.hidden_size);
    reservoir_a_.push_back(at::empty({capacity_, producer.hidden_size}, at::kFloat));
    reservoir_b_.push_back(at::empty({capacity_, consumer.hidden_size}, at::kFloat));
  }
}

absl::Status PairedTraces::Add(const Captures& producer, const Captures& consumer) {
  if (static_cast<int>(producer.size()) != layers() ||
      static_cast<int>(consumer.size()) != layers()) {
    return absl::InvalidArgumentError("paired traces need captures of every layer of both models");
  }
  const int64_t T = producer.begin()->second.attn_input.size(0);
  // Reservoir slots for this prefix's rows (the same slots in every layer keeps rows paired
  // across layers too).
  std::vector<int64_t> source, slot;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t seen = rows_seen_ + t;
    if (kept_ < capacity_) {
      source.push_back(t);
      slot.push_back(kept_++);
    } else {
      std::uniform_int_distribution<int64_t> pick(0, seen);
      const int64_t j = pick(rng_);
      if (j < capacity_) {
        source.push_back(t);
        slot.push_back(j);
      }
    }
  }
  rows_seen_ += T;
  at::Tensor src = at::tensor(source, at::TensorOptions().dtype(at::kLong));
  at::Tensor dst = at::tensor(slot, at::TensorOptions().dtype(at::kLong));
  for (int l = 0; l < layers(); ++l) {
    const LayerCapture& a = producer.at(l);
    const LayerCapture& b = consumer.at(l);
    if (!a.key_prerope.defined() || !b.key_prerope.defined() || !a.attn_input.defined() ||
        !b.attn_input.defined() || a.attn_input.size(0) != T || b.attn_input.size(0) != T) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " captures are incomplete"));
    }
    for (size_t h = 0; h < keys_[l].size(); ++h) {
      keys_[l][h].Add(a.key_prerope[h], b.key_prerope[h]);  // [T, head_dim] each
      values_[l][h].Add(a.value[h], b.value[h]);
    }
    hidden_[l].Add(a.attn_input, b.attn_input);
    if (!source.empty()) {
      reservoir_a_[l].index_copy_(0, dst,
                                  a.attn_input.to(at::kCPU, at::kFloat).index_select(0, src));
      reservoir_b_[l].index_copy_(0, dst,
                                  b.attn_input.to(at::kCPU, at::kFloat).index_select(0, src));
    }
  }
  return absl::OkStatus();
}

at::Tensor PairedTraces::hidden_a(int layer) const {
  return reservoir_a_[layer].narrow(0, 0, kept_);
}
at::Tensor PairedTraces::hidden_b(int layer) const {
  return reservoir_b_[layer].narrow(0, 0, kept_);
}

GramStats PairedTraces::Merged(const std::vector<GramStats>& per_head) {
  GramStats merged(per_head.front().dim_a(), per_head.front().dim_b());
  for (const GramStats& g : per_head) merged.Merge(g);
  return merged;
}

}  // namespace scd
