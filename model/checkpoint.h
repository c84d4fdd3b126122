// Checkpoint: the tensors of a Hugging Face model directory, stored either in one
// `model.safetensors` or sharded as listed by `model.safetensors.index.json`.
// Thread-safety: immutable after Open(); safe from many threads.
#ifndef SCD_MODEL_CHECKPOINT_H_
#define SCD_MODEL_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/safetensors.h"

namespace scd {

class Checkpoint {
 public:
  // Opens `dir`; prefers the sharded index when both layouts are present. Every shard the index
  // names must exist and hold the tensors the index maps to it.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool sharded() const { return files_.size() > 1 || index_used_; }
  // All tensor names across shards, sorted.
  std::vector<std::string> names() const;
  // nullptr when absent.
  const TensorEntry* Find(std::string_view name) const;
  // Copies a tensor out (converted to `dtype`); NotFound names the tensor and the directory.
  absl::StatusOr<at::Tensor> Load(std::string_view name, c10::ScalarType dtype) const;

 private:
  std::string dir_;
  bool index_used_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorEntry*, std::less<>> entries_;
};

}  // namespace scd

#endif  // SCD_MODEL_CHECKPOINT_H_
