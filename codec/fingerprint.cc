#include "codec/fingerprint.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/checkpoint.h"
#include "model/runtime.h"

namespace scd {

std::string CanonicalConfig(const ModelConfig& c) {
  return absl::StrCat("model_type=", c.model_type, ";hidden=", c.hidden_size,
                      ";ffn=", c.intermediate_size, ";layers=", c.num_layers,
                      ";heads=", c.num_heads, ";kv_heads=", c.num_kv_heads,
                      ";head_dim=", c.head_dim, ";vocab=", c.vocab_size,
                      ";max_positions=", c.max_position_embeddings,
                      ";eps=", absl::StrFormat("%.9g", c.rms_norm_eps), ";rope=", c.rope.ToString(),
                      ";tied=", c.tie_word_embeddings, ";qkv_bias=", c.qkv_bias,
                      ";o_bias=", c.o_bias, ";mlp_bias=", c.mlp_bias,
                      ";window=", c.sliding_window ? absl::StrCat(*c.sliding_window) : "none");
}

absl::StatusOr<std::string> FingerprintModelDir(const std::string& dir) {
  SCD_ASSIGN_OR_RETURN(
      ModelConfig config,
      ModelConfig::FromFile((std::filesystem::path(dir) / "config.json").string()));
  SCD_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(dir));
  Sha256 h;
  h.Update(CanonicalConfig(config));
  for (const std::string& name : checkpoint->names()) {  // sorted
    const TensorEntry* e = checkpoint->Find(name);
    h.Update(absl::StrCat("\n", name, ":", std::string(StDtypeName(e->dtype)), ":",
                          absl::StrJoin(e->shape, ","), "\n"));
    h.Update(e->data, static_cast<size_t>(e->size_bytes));
  }
  return h.HexDigest();
}

absl::StatusOr<std::string> FingerprintModel(const LlamaModel& model) {
  return GuardExceptions("FingerprintModel", [&]() -> absl::StatusOr<std::string> {
    if (!model.source().empty()) return FingerprintModelDir(model.source());
    Sha256 h;
    h.Update(CanonicalConfig(model.config()));
    auto add = [&](const std::string& name, const at::Tensor& t) {
      if (!t.defined()) return;
      at::Tensor c = t.to(at::kCPU).contiguous();
      h.Update(absl::StrCat("\n", name, ":", c10::toString(c.scalar_type()), ":",
                            absl::StrJoin(c.sizes().vec(), ","), "\n"));
      h.Update(c.data_ptr(), c.numel() * c.element_size());
    };
    // Packed weights (below float32 on a CPU) by what they store.
    auto add_packed = [&](const std::string& name, const PackedWeight& packed) {
      if (packed.empty()) return;
      add(absl::StrCat(name, ".", WeightFormatName(packed.format())), packed.panels());
      add(name + ".scales", packed.scales());
    };
    const ModelWeights& w = model.weights();
    add("embed", w.embed);
    add("lm_head", w.lm_head);
    add_packed("embed", w.packed_embed);
    add_packed("lm_head", w.packed_lm_head);
    add("final_norm", w.final_norm);
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& lw = w.layers[l];
      const std::string p = absl::StrCat("layer", l, ".");
      add(p + "attn_norm", lw.attn_norm);
      add(p + "wqkv", lw.wqkv);
      add(p + "bqkv", lw.bqkv);
      add(p + "wo", lw.wo);
      add(p + "bo", lw.bo);
      add(p + "mlp_norm", lw.mlp_norm);
      add(p + "w_gate_up", lw.w_gate_up);
      add(p + "b_gate_up", lw.b_gate_up);
      add(p + "w_down", lw.w_down);
      add(p + "b_down", lw.b_down);
      add_packed(p + "wqkv", lw.packed_qkv);
      add_packed(p + "wo", lw.packed_o);
      add_packed(p + "w_gate_up", lw.packed_gate_up);
      add_packed(p + "w_down", lw.packed_down);
    }
    return h.HexDigest();
  });
}

absl::StatusOr<ServedModel> LoadServedModel(const ServedModelSpec& spec) {
  namespace fs = std::filesystem;
  if (spec.model_dir.empty() == spec.dummy_config.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --model DIR and --dummy-weights CONFIG");
  }
  const bool dummy = !spec.dummy_config.empty();
  ServedModel served;
  fs::path path = fs::path(dummy ? spec.dummy_config : spec.model_dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "dir/" -> "dir"
  const bool directory = fs::is_directory(path);
  served.name = !spec.name.empty() ? spec.name
                                   : (directory ? path.filename() : path.stem()).string();
  LlamaModel::Options runtime;
  SCD_ASSIGN_OR_RETURN(runtime.device, ParseDevice(spec.device));
  SCD_ASSIGN_OR_RETURN(const Precision precision, ParsePrecision(spec.dtype, runtime.device));
  runtime.dtype = precision.dtype;
  runtime.weights = precision.weights;
  if (dummy) {
    SCD_ASSIGN_OR_RETURN(served.model, LlamaModel::DummyFromConfig(path.string(), spec.seed,
                                                                   spec.layers, runtime));
  } else {
    if (spec.layers > 0) return absl::InvalidArgumentError("--layers needs --dummy-weights");
    SCD_ASSIGN_OR_RETURN(served.model, LlamaModel::Load(path.string(), runtime));
  }
  const fs::path tokenizer = path / "tokenizer.json";
  if (!dummy || (directory && fs::exists(tokenizer))) {
    SCD_ASSIGN_OR_RETURN(served.tokenizer, Tokenizer::FromFile(tokenizer.string()));
  }
  SCD_ASSIGN_OR_RETURN(served.fingerprint, FingerprintModel(*served.model));
  return served;
}

}  // namespace scd
