#include "model/gguf_export.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/gguf_vocab.h"

namespace scd {
namespace {

// llama.cpp's file types (llama.h, enum llama_ftype).
uint32_t FileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
  }
  return 0;
}

// Rows of a [heads * hd, ...] projection from rotate-half order (row s * hd/2 + i of a head) to
// interleaved pairs (row 2 i + s), as convert_hf_to_gguf.py's permute().
at::Tensor InterleaveHeads(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), hd = rows / heads;
  std::vector<int64_t> shape = {heads, 2, hd / 2};
  for (int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes());
}

class Exporter {
 public:
  Exporter(const LlamaModel& model, const GgufExportOptions& options)
      : model_(model), c_(model.config()), options_(options) {}

  absl::StatusOr<GgufExportReport> Run(const std::string& path) {
    SCD_RETURN_IF_ERROR(Check());
    report_.architecture = arch_;
    SCD_RETURN_IF_ERROR(Metadata());
    Tensors();
    SCD_RETURN_IF_ERROR(writer_.Write(path));
    std::error_code ec;
    report_.bytes = std::filesystem::file_size(path, ec);
    return report_;
  }

 private:
  absl::Status Check() {
    if (model_.weight_format() != WeightFormat::kDense || !model_.device().is_cpu()) {
      return absl::InvalidArgumentError(
          "GGUF export reads dense weights on the CPU: load the model as f32 (--dtype f32)");
    }
    if (c_.model_type == "llama" || c_.model_type == "mistral") {
      arch_ = "llama";
    } else if (c_.model_type == "qwen2") {
      arch_ = "qwen2";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("model_type '", c_.model_type, "' has no GGUF form here"));
    }
    if (c_.o_bias || c_.mlp_bias || (c_.qkv_bias && arch_ == "llama")) {
      return absl::InvalidArgumentError(
          "GGUF export: llama with attention or MLP biases is not written (llama.cpp ignores them)");
    }
    return absl::OkStatus();
  }

  absl::Status Metadata() {
    writer_.SetString("general.architecture", arch_);
    writer_.SetString("general.name", options_.name);
    if (!options_.description.empty()) {
      writer_.SetString("general.description", options_.description);
    }
    writer_.SetUint32("general.file_type", FileType(options_.type));
    if (options_.type == GgmlType::kQ8_0) writer_.SetUint32("general.quantization_version", 2);
    const std::string a = arch_ + ".";
    writer_.SetUint32(a + "vocab_size", static_cast<uint32_t>(c_.vocab_size));
    writer_.SetUint32(a + "context_length", static_cast<uint32_t>(c_.max_position_embeddings));
    writer_.SetUint32(a + "embedding_length", static_cast<uint32_t>(c_.hidden_size));
    writer_.SetUint32(a + "block_count", static_cast<uint32_t>(c_.num_layers));
    writer_.SetUint32(a + "feed_forward_length", static_cast<uint32_t>(c_.intermediate_size));
    writer_.SetUint32(a + "rope.dimension_count", static_cast<uint32_t>(c_.head_dim));
    writer_.SetUint32(a + "attention.head_count", static_cast<uint32_t>(c_.num_heads));
    writer_.SetUint32(a + "attention.head_count_kv", static_cast<uint32_t>(c_.num_kv_heads));
    writer_.SetUint32(a + "attention.key_length", static_cast<uint32_t>(c_.head_dim));
    writer_.SetUint32(a + "attention.value_length", static_cast<uint32_t>(c_.head_dim));
    writer_.SetFloat32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c_.rms_norm_eps));
    writer_.SetFloat32(a + "rope.freq_base", static_cast<float>(c_.rope.theta));
    if (c_.rope.scaling == RopeScalingType::kLinear) {
      writer_.SetString(a + "rope.scaling.type", "linear");
      writer_.SetFloat32(a + "rope.scaling.factor", static_cast<float>(c_.rope.factor));
    }
    GgufVocabulary vocab;
    if (options_.tokenizer_json.empty()) {
      vocab = PlaceholderVocabulary(c_);
    } else {
      SCD_ASSIGN_OR_RETURN(vocab, VocabularyFromTokenizerJson(options_.tokenizer_json, c_));
    }
    vocab.AddTo(&writer_);
    report_.vocabulary = vocab.kind;
    return absl::OkStatus();
  }

  // A tensor of the model (float32 values when the file is written); matrices in the file's type.
  void Add(const std::string& name, at::Tensor t) {
    if (!t.defined()) return;
    GgmlType type = t.dim() == 1 ? GgmlType::kF32 : options_.type;
    if (type == GgmlType::kQ8_0 && !Q8_0Fits(t.size(-1))) {
      type = GgmlType::kF32;
      report_.kept_f32.push_back(name);
    }
    writer_.AddTensor(name, t.sizes().vec(), type, [t](std::vector<float>* out) {
      const at::Tensor c = t.to(at::kFloat).contiguous();
      out->assign(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    });
    ++report_.tensors;
  }

  void Tensors() {
    const ModelWeights& w = model_.weights();
    Add("token_embd.weight", w.embed);
    Add("output_norm.weight", w.final_norm);
    if (!c_.tie_word_embeddings) Add("output.weight", w.lm_head);
    if (c_.rope.scaling == RopeScalingType::kLlama3) Add("rope_freqs.weight", RopeFactors());
    const bool interleave = arch_ == "llama";
    for (int64_t l = 0; l < c_.num_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      const std::string p = absl::StrCat("blk.", l, ".");
      Add(p + "attn_norm.weight", lw.attn_norm);
      at::Tensor q = lw.Wq(c_), k = lw.Wk(c_);
      Add(p + "attn_q.weight", interleave ? InterleaveHeads(q, c_.num_heads) : q);
      Add(p + "attn_k.weight", interleave ? InterleaveHeads(k, c_.num_kv_heads) : k);
      Add(p + "attn_v.weight", lw.Wv(c_));
      if (lw.bqkv.defined()) {  // qwen2 (NEOX rope: no permutation)
        Add(p + "attn_q.bias", lw.bqkv.narrow(0, 0, c_.q_dim()));
        Add(p + "attn_k.bias", lw.Bk(c_));
        Add(p + "attn_v.bias", lw.Bv(c_));
      }
      Add(p + "attn_output.weight", lw.wo);
      Add(p + "ffn_norm.weight", lw.mlp_norm);
      const int64_t f = c_.intermediate_size;
      Add(p + "ffn_gate.weight", lw.w_gate_up.narrow(0, 0, f));
      Add(p + "ffn_up.weight", lw.w_gate_up.narrow(0, f, f));
      Add(p + "ffn_down.weight", lw.w_down);
    }
  }

  // Llama3 scaling as llama.cpp applies it: each frequency divided by a factor.
  at::Tensor RopeFactors() const {
    const RopeConfig unscaled{c_.rope.theta};
    const RotaryEmbedding plain(unscaled, c_.head_dim);
    const std::vector<double>& base = plain.inv_freq();
    const std::vector<double>& scaled = model_.rope().inv_freq();
    at::Tensor f = at::empty({static_cast<int64_t>(base.size())}, at::kFloat);
    for (size_t i = 0; i < base.size(); ++i) f[i] = static_cast<float>(base[i] / scaled[i]);
    return f;
  }

  const LlamaModel& model_;
  const ModelConfig& c_;
  const GgufExportOptions& options_;
  std::string arch_;
  GgufWriter writer_;
  GgufExportReport report_;
};

}  // namespace

absl::StatusOr<GgufExportReport> ExportGguf(const LlamaModel& model,
                                            const GgufExportOptions& options,
                                            const std::string& path) {
  return GuardExceptions("ExportGguf", [&]() -> absl::StatusOr<GgufExportReport> {
    return Exporter(model, options).Run(path);
  });
}

absl::StatusOr<GgmlType> ParseGgmlType(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "f32") return GgmlType::kF32;
  if (n == "f16") return GgmlType::kF16;
  if (n == "bf16") return GgmlType::kBF16;
  if (n == "q8_0") return GgmlType::kQ8_0;
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF type '", name, "' is not one of f32, f16, bf16, q8_0"));
}

}  // namespace scd
