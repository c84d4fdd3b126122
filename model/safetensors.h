// SafetensorsFile: a memory-mapped, validated view of one .safetensors file (the Hugging Face
// format: u64 little-endian header length, JSON header, raw little-endian tensor bytes).
// Open() checks everything a hostile or truncated file could get wrong before any tensor is
// touched: header length, JSON, dtype names, shapes, offsets inside the data section,
// non-overlapping ranges and byte size = numel x element size.
// Thread-safety: immutable after Open(); all methods are safe from many threads.
#ifndef SCD_MODEL_SAFETENSORS_H_
#define SCD_MODEL_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

enum class StDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32" -> kF32 etc.; error for names outside the safetensors spec subset above.
absl::StatusOr<StDtype> ParseStDtype(std::string_view name);
std::string_view StDtypeName(StDtype dtype);
int64_t StDtypeSize(StDtype dtype);
c10::ScalarType StDtypeToScalarType(StDtype dtype);
absl::StatusOr<StDtype> ScalarTypeToStDtype(c10::ScalarType type);

// One tensor's entry in the header plus a pointer to its bytes inside the mapping.
struct TensorEntry {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // borrowed from the mapping; unaligned in general
  int64_t size_bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // The header's "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  // nullptr when absent.
  const TensorEntry* Find(std::string_view name) const;
  // Copies a tensor out of the mapping into a new CPU tensor converted to `dtype`.
  absl::StatusOr<at::Tensor> Load(std::string_view name, c10::ScalarType dtype) const;
  // The same for an entry of this file.
  static at::Tensor ToTensor(const TensorEntry& entry, c10::ScalarType dtype);

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(std::string_view header, int64_t data_size, const uint8_t* data);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorEntry, std::less<>> tensors_;
};

// Builds a .safetensors file: tensors are copied at Add() time, Write() is atomic (temp file +
// rename). Used by tests (sharded/bf16 round trips) and by the codec's artifact format.
// Thread-safety: not thread-safe.
class SafetensorsWriter {
 public:
  void SetMetadata(const std::string& key, const std::string& value);
  // Stores `tensor` (any device, made contiguous) as `store_as` (default: its own dtype).
  absl::Status Add(const std::string& name, const at::Tensor& tensor);
  absl::Status Add(const std::string& name, const at::Tensor& tensor, c10::ScalarType store_as);
  absl::Status Write(const std::string& path) const;

 private:
  std::map<std::string, std::string> metadata_;
  std::map<std::string, at::Tensor> tensors_;
};

}  // namespace scd

#endif  // SCD_MODEL_SAFETENSORS_H_
