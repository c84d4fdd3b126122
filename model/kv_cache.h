// KvCache: one sequence's native KV cache. Per layer it holds post-RoPE keys and values
// [kv_heads, length, head_dim] in preallocated storage that grows by doubling, so decode steps
// append in place. Layers keep separate lengths so a layer range (recompute, patching) or an
// external prefix can fill layers independently; a full forward needs them all equal.
// Thread-safety: not thread-safe; one sequence is driven by one thread at a time.
#ifndef SCD_MODEL_KV_CACHE_H_
#define SCD_MODEL_KV_CACHE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"

namespace scd {

class KvCache {
 public:
  // `capacity` is a hint in tokens (storage grows past it when needed).
  KvCache(const ModelConfig& config, int64_t capacity, c10::ScalarType dtype, c10::Device device);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int64_t length(int layer) const { return layers_[layer].length; }
  // Length of layer 0; equals every layer's length whenever uniform() holds.
  int64_t length() const { return layers_.empty() ? 0 : layers_[0].length; }
  bool uniform() const;
  int64_t capacity() const { return capacity_; }
  c10::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }

  // Views of the filled part: [kv_heads, length(layer), head_dim]. Valid until the next Append.
  at::Tensor keys(int layer) const;
  at::Tensor values(int layer) const;

  // Appends `k` (already rotated) and `v`, both [kv_heads, t, head_dim], to `layer`.
  // REQUIRES: shapes match the config.
  void Append(int layer, const at::Tensor& k, const at::Tensor& v);
  // Appends one position from memory: `k` and `v` each kv_heads x head_dim values of the cache's
  // dtype, head after head (a decode row of a batched step, without a tensor per row). False,
  // nothing done, when the cache is not on the CPU.
  bool AppendRow(int layer, const void* k, const void* v);
  // The layer's whole storage, [kv_heads, capacity, head_dim] (positions from length(layer) on
  // hold nothing yet): for kernels that read the cache in place (model/decode_attention.h).
  // Valid until the next Append.
  const at::Tensor& key_storage(int layer) const { return layers_[layer].k; }
  const at::Tensor& value_storage(int layer) const { return layers_[layer].v; }
  // Drops every position >= length in every layer (e.g. to reuse a shared prefix).
  absl::Status Truncate(int64_t length);
  void Clear();
  // Bytes of K and V currently held (filled positions only).
  int64_t bytes_used() const;

 private:
  struct Layer {
    at::Tensor k, v;  // [kv_heads, capacity, head_dim]
    int64_t length = 0;
  };
  void Grow(int64_t min_capacity);

  int64_t kv_heads_, head_dim_, capacity_;
  c10::ScalarType dtype_;
  c10::Device device_;
  std::vector<Layer> layers_;
};

}  // namespace scd

#endif  // SCD_MODEL_KV_CACHE_H_
