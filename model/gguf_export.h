// ExportGguf: a checkpoint the runtime loads, written as a GGUF file llama.cpp runs -- the same
// numbers in another engine, for side-by-side benchmarks and as an independent check of this
// runtime's tokens (bench/peer/, tests/peer_greedy_test.cc).
//
// What llama.cpp's convert_hf_to_gguf.py does for a Llama checkpoint, done from the loaded model:
// the llama metadata (llama.* keys: lengths, heads, eps, rope base and scaling), the tokenizer
// (model/gguf_vocab.h), and the tensors under ggml's names (token_embd, blk.N.attn_q, ...; output
// only when the embeddings are not tied). Q and K rows are permuted from the Hugging Face
// rotate-half layout to the interleaved pairs llama.cpp's rotary embedding (rope type NORM) turns.
// Norms stay F32; matrices take the file's type, except that a Q8_0 file keeps a matrix whose rows
// are not a multiple of 32 long in F32 (Q8_0 blocks are 32 values of a row), and says so
// (GgufExportReport::kept_f32). Llama3 rope scaling is written as llama.cpp's rope_freqs tensor.
//
// Thread-safety: reads the model only.
#ifndef SCD_MODEL_GGUF_EXPORT_H_
#define SCD_MODEL_GGUF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf_writer.h"
#include "model/llama_model.h"

namespace scd {

struct GgufExportOptions {
  GgmlType type = GgmlType::kF32;  // F32, F16, BF16 or Q8_0
  std::string name;                // general.name
  std::string description;         // general.description ("" = none)
  // The checkpoint's tokenizer.json; "" = the placeholder vocabulary (dummy weights).
  std::string tokenizer_json;
};

struct GgufExportReport {
  int64_t tensors = 0;
  uint64_t bytes = 0;                 // the file's size
  std::vector<std::string> kept_f32;  // matrices a Q8_0 file keeps in F32
  std::string vocabulary;             // GgufVocabulary::kind
  std::string architecture;           // general.architecture
};

// REQUIRES: the model's weights are dense (WeightFormat::kDense), on the CPU.
// INVALID_ARGUMENT: a model this writer has no GGUF form for (packed weights, a model type other
// than llama/mistral/qwen2, biases llama.cpp's llama graph would ignore), a tokenizer it cannot
// express; PERMISSION_DENIED / DATA_LOSS: the file could not be written. A sliding window
// (mistral) is not written: llama.cpp's llama graph attends to the whole context.
absl::StatusOr<GgufExportReport> ExportGguf(const LlamaModel& model,
                                            const GgufExportOptions& options,
                                            const std::string& path);

// "f32", "f16", "bf16", "q8_0" -> the type (case-insensitive).
absl::StatusOr<GgmlType> ParseGgmlType(const std::string& name);

}  // namespace scd

#endif  // SCD_MODEL_GGUF_EXPORT_H_
