// GgufWriter: writes a GGUF file (version 3), the format llama.cpp and the ggml tools read:
// a header, typed metadata (key -> value), tensor descriptions, then every tensor's data aligned to
// 32 bytes. Tensors are encoded when the file is written, one at a time, so a writer holds no more
// than one tensor's encoded bytes. The format: ggml's docs/gguf.md.
//
// Encodings: F32, F16 and BF16 element by element (round to nearest even), and Q8_0 -- blocks of
// 32 values along a row, each an f16 scale d = max |x| / 127 and 32 int8 q = round(x / d), as
// ggml's quantize_row_q8_0_ref does. A Q8_0 tensor's rows must be a multiple of 32 long
// (Q8_0Fits).
//
// Thread-safety: a writer is used from one thread.
#ifndef SCD_MODEL_GGUF_WRITER_H_
#define SCD_MODEL_GGUF_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace scd {

// ggml's type ids (ggml.h, enum ggml_type).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30 };
const char* GgmlTypeName(GgmlType type);  // "F32", "F16", "Q8_0", "BF16"
// Bytes of `elements` values (a whole number of rows) in `type`.
uint64_t GgmlBytes(GgmlType type, uint64_t elements);
// Whether rows of `row_length` values can be Q8_0 blocks.
inline bool Q8_0Fits(int64_t row_length) { return row_length % 32 == 0; }

// Appends `values` encoded as `type` to `out`. REQUIRES: Q8_0 -> values.size() % 32 == 0.
void EncodeGgml(GgmlType type, absl::Span<const float> values, std::string* out);

class GgufWriter {
 public:
  void SetString(const std::string& key, const std::string& value);
  void SetUint32(const std::string& key, uint32_t value);
  void SetFloat32(const std::string& key, float value);
  void SetBool(const std::string& key, bool value);
  void SetStringArray(const std::string& key, const std::vector<std::string>& values);
  void SetFloat32Array(const std::string& key, const std::vector<float>& values);
  void SetInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // A tensor of shape `shape` (outermost first, as a row-major [rows, cols] is {rows, cols}; GGUF
  // lists it innermost first) in `type`; `values` fills `out` with its float32 values in
  // row-major order when the file is written.
  using Values = std::function<void(std::vector<float>* out)>;
  void AddTensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                 Values values);

  // Writes the file (to `path`.tmp, then renamed). INVALID_ARGUMENT: a Q8_0 tensor whose rows
  // are not a multiple of 32, or values of the wrong count.
  absl::Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    Values values;
  };
  std::string metadata_;  // encoded key/value pairs
  uint64_t metadata_count_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace scd

#endif  // SCD_MODEL_GGUF_WRITER_H_
