#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"

namespace scd {

KvCache::KvCache(const ModelConfig& config, int64_t capacity, c10::ScalarType dtype,
                 c10::Device device)
    : kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      capacity_(std::max<int64_t>(capacity, 1)),
      dtype_(dtype),
      device_(device),
      layers_(config.num_layers) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  for (Layer& layer : layers_) {
    layer.k = at::empty({kv_heads_, capacity_, head_dim_}, options);
    layer.v = at::empty({kv_heads_, capacity_, head_dim_}, options);
  }
}

bool KvCache::uniform() const {
  for (const Layer& layer : layers_) {
    if (layer.length != length()) return false;
  }
  return true;
}

at::Tensor KvCache::keys(int layer) const {
  return layers_[layer].k.narrow(1, 0, layers_[layer].length);
}

at::Tensor KvCache::values(int layer) const {
  return layers_[layer].v.narrow(1, 0, layers_[layer].length);
}

void KvCache::Grow(int64_t min_capacity) {
  const int64_t new_capacity = std::max(min_capacity, 2 * capacity_);
  const auto options = at::TensorOptions().dtype(dtype_).device(device_);
  for (Layer& layer : layers_) {
    at::Tensor k = at::empty({kv_heads_, new_capacity, head_dim_}, options);
    at::Tensor v = at::empty({kv_heads_, new_capacity, head_dim_}, options);
    k.narrow(1, 0, layer.length).copy_(layer.k.narrow(1, 0, layer.length));
    v.narrow(1, 0, layer.length).copy_(layer.v.narrow(1, 0, layer.length));
    layer.k = std::move(k);
    layer.v = std::move(v);
  }
  capacity_ = new_capacity;
}

void KvCache::Append(int layer, const at::Tensor& k, const at::Tensor& v) {
  Layer& l = layers_[layer];
  const int64_t t = k.size(1);
  if (l.length + t > capacity_) Grow(l.length + t);
  layers_[layer].k.narrow(1, l.length, t).copy_(k);
  layers_[layer].v.narrow(1, l.length, t).copy_(v);
  l.length += t;
}

bool KvCache::AppendRow(int layer, const void* k, const void* v) {
  if (!device_.is_cpu()) return false;
  Layer& l = layers_[layer];
  if (l.length + 1 > capacity_) Grow(l.length + 1);
  const size_t row = static_cast<size_t>(head_dim_) * c10::elementSize(dtype_);
  const size_t head = static_cast<size_t>(capacity_) * row;  // one head's storage
  auto* kd = static_cast<char*>(l.k.data_ptr()) + static_cast<size_t>(l.length) * row;
  auto* vd = static_cast<char*>(l.v.data_ptr()) + static_cast<size_t>(l.length) * row;
  for (int64_t h = 0; h < kv_heads_; ++h) {
    std::memcpy(kd + h * head, static_cast<const char*>(k) + h * row, row);
    std::memcpy(vd + h * head, static_cast<const char*>(v) + h * row, row);
  }
  ++l.length;
  return true;
}

absl::Status KvCache::Truncate(int64_t length) {
  return GuardExceptions("KvCache::Truncate", [&]() -> absl::Status {
    if (length < 0) return absl::InvalidArgumentError("KvCache::Truncate: negative length");
    for (Layer& layer : layers_) {
      if (layer.length < length) {
        return absl::InvalidArgumentError(absl::StrCat("KvCache::Truncate: a layer holds only ",
                                                       layer.length, " < ", length, " positions"));
      }
    }
    for (Layer& layer : layers_) layer.length = length;
    return absl::OkStatus();
  });
}

void KvCache::Clear() {
  for (Layer& layer : layers_) layer.length = 0;
}

int64_t KvCache::bytes_used() const {
  int64_t total = 0;
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype_));
  for (const Layer& layer : layers_) total += 2 * kv_heads_ * layer.length * head_dim_ * element;
  return total;
}

}  // namespace scd
