#include "model/weights.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/huge_pages.h"

namespace scd {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Loads one tensor and checks its shape against what the config implies.
class TensorLoader {
 public:
  TensorLoader(const Checkpoint& ckpt, c10::ScalarType dtype) : ckpt_(ckpt), dtype_(dtype) {}

  absl::StatusOr<at::Tensor> Get(const std::string& name, std::vector<int64_t> shape) const {
    SCD_ASSIGN_OR_RETURN(at::Tensor t, ckpt_.Load(name, dtype_));
    if (t.sizes() != at::IntArrayRef(shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ckpt_.dir(), ": tensor '", name, "' has shape ", ShapeString(t.sizes()),
                       " but config.json implies ", ShapeString(shape)));
    }
    return t;
  }

 private:
  const Checkpoint& ckpt_;
  c10::ScalarType dtype_;
};

// Layer `l`'s tensors, fused as the runtime holds them (q/k/v, gate/up).
absl::StatusOr<LayerWeights> LoadLayer(TensorLoader& load, const ModelConfig& c, int64_t l) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const std::string p = absl::StrCat("model.layers.", l, ".");
  LayerWeights lw;
  SCD_ASSIGN_OR_RETURN(lw.attn_norm, load.Get(p + "input_layernorm.weight", {d}));
  SCD_ASSIGN_OR_RETURN(lw.mlp_norm, load.Get(p + "post_attention_layernorm.weight", {d}));
  SCD_ASSIGN_OR_RETURN(at::Tensor wq, load.Get(p + "self_attn.q_proj.weight", {c.q_dim(), d}));
  SCD_ASSIGN_OR_RETURN(at::Tensor wk, load.Get(p + "self_attn.k_proj.weight", {c.kv_dim(), d}));
  SCD_ASSIGN_OR_RETURN(at::Tensor wv, load.Get(p + "self_attn.v_proj.weight", {c.kv_dim(), d}));
  SCD_ASSIGN_OR_RETURN(lw.wo, load.Get(p + "self_attn.o_proj.weight", {d, c.q_dim()}));
  lw.wqkv = at::cat({wq, wk, wv}, 0);
  if (c.qkv_bias) {
    SCD_ASSIGN_OR_RETURN(at::Tensor bq, load.Get(p + "self_attn.q_proj.bias", {c.q_dim()}));
    SCD_ASSIGN_OR_RETURN(at::Tensor bk, load.Get(p + "self_attn.k_proj.bias", {c.kv_dim()}));
    SCD_ASSIGN_OR_RETURN(at::Tensor bv, load.Get(p + "self_attn.v_proj.bias", {c.kv_dim()}));
    lw.bqkv = at::cat({bq, bk, bv}, 0);
  }
  if (c.o_bias) {
    SCD_ASSIGN_OR_RETURN(lw.bo, load.Get(p + "self_attn.o_proj.bias", {d}));
  }
  SCD_ASSIGN_OR_RETURN(at::Tensor wg, load.Get(p + "mlp.gate_proj.weight", {f, d}));
  SCD_ASSIGN_OR_RETURN(at::Tensor wu, load.Get(p + "mlp.up_proj.weight", {f, d}));
  SCD_ASSIGN_OR_RETURN(lw.w_down, load.Get(p + "mlp.down_proj.weight", {d, f}));
  lw.w_gate_up = at::cat({wg, wu}, 0);
  if (c.mlp_bias) {
    SCD_ASSIGN_OR_RETURN(at::Tensor bg, load.Get(p + "mlp.gate_proj.bias", {f}));
    SCD_ASSIGN_OR_RETURN(at::Tensor bu, load.Get(p + "mlp.up_proj.bias", {f}));
    SCD_ASSIGN_OR_RETURN(lw.b_down, load.Get(p + "mlp.down_proj.bias", {d}));
    lw.b_gate_up = at::cat({bg, bu}, 0);
  }
  return lw;
}

}  // namespace

void LayerWeights::MoveOntoHugePages() {
  for (at::Tensor* t : {&wqkv, &wo, &w_gate_up, &w_down}) *t = OnHugePages(*t);
}

void ModelWeights::MoveHeadOntoHugePages(const ModelConfig& c) {
  embed = OnHugePages(embed);
  lm_head = c.tie_word_embeddings ? embed : OnHugePages(lm_head);
}

void LayerWeights::Pack(WeightFormat format) {
  const auto pack = [format](at::Tensor& dense, PackedWeight& packed) {
    packed = PackedWeight::Pack(dense, format);
    dense = at::Tensor();
  };
  pack(wqkv, packed_qkv);
  pack(wo, packed_o);
  pack(w_gate_up, packed_gate_up);
  pack(w_down, packed_down);
  // Biases and norms stay float32 (the kernels add the bias in float32).
}

void ModelWeights::PackHead(const ModelConfig& c, WeightFormat format) {
  packed_lm_head = PackedWeight::Pack(lm_head, format);
  if (!c.tie_word_embeddings) packed_embed = PackedWeight::Pack(embed, format);
  embed = at::Tensor();
  lm_head = at::Tensor();
}

at::Tensor LayerWeights::Qkv() const { return wqkv.defined() ? wqkv : packed_qkv.Unpack(); }
at::Tensor LayerWeights::Wq(const ModelConfig& c) const { return Qkv().narrow(0, 0, c.q_dim()); }
at::Tensor LayerWeights::Wk(const ModelConfig& c) const {
  return Qkv().narrow(0, c.q_dim(), c.kv_dim());
}
at::Tensor LayerWeights::Wv(const ModelConfig& c) const {
  return Qkv().narrow(0, c.q_dim() + c.kv_dim(), c.kv_dim());
}
at::Tensor LayerWeights::Bk(const ModelConfig& c) const {
  return bqkv.defined() ? bqkv.narrow(0, c.q_dim(), c.kv_dim()) : at::Tensor();
}
at::Tensor LayerWeights::Bv(const ModelConfig& c) const {
  return bqkv.defined() ? bqkv.narrow(0, c.q_dim() + c.kv_dim(), c.kv_dim()) : at::Tensor();
}

absl::StatusOr<ModelWeights> ModelWeights::Load(const Checkpoint& ckpt, const ModelConfig& c,
                                                c10::ScalarType dtype, c10::Device device,
                                                WeightFormat format) {
  const bool packed = format != WeightFormat::kDense;
  if (packed && (dtype != c10::kFloat || !device.is_cpu())) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(format), " weights run on the CPU in float32 only"));
  }
  return GuardExceptions("ModelWeights::Load", [&]() -> absl::StatusOr<ModelWeights> {
    TensorLoader load(ckpt, dtype);
    const int64_t d = c.hidden_size, V = c.vocab_size;
    ModelWeights w;
    const bool has_embed = ckpt.Find("model.embed_tokens.weight") != nullptr;
    const bool has_head = ckpt.Find("lm_head.weight") != nullptr;
    if (c.tie_word_embeddings) {
      if (!has_embed && !has_head) {
        return absl::NotFoundError(absl::StrCat(
            ckpt.dir(), ": tied embeddings need 'model.embed_tokens.weight' or 'lm_head.weight'"));
      }
      SCD_ASSIGN_OR_RETURN(
          w.embed, load.Get(has_embed ? "model.embed_tokens.weight" : "lm_head.weight", {V, d}));
      w.lm_head = w.embed;
    } else {
      SCD_ASSIGN_OR_RETURN(w.embed, load.Get("model.embed_tokens.weight", {V, d}));
      SCD_ASSIGN_OR_RETURN(w.lm_head, load.Get("lm_head.weight", {V, d}));
    }
    SCD_ASSIGN_OR_RETURN(w.final_norm, load.Get("model.norm.weight", {d}));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      SCD_ASSIGN_OR_RETURN(LayerWeights lw, LoadLayer(load, c, l));
      if (packed) {
        lw.Pack(format);
      } else {
        lw.MoveOntoHugePages();
      }
      w.layers.push_back(std::move(lw));
    }
    if (packed) {
      w.PackHead(c, format);
    } else {
      w.MoveHeadOntoHugePages(c);
    }
    if (!device.is_cpu()) {
      auto move = [&](at::Tensor& t) {
        if (t.defined()) t = t.to(device);
      };
      move(w.embed);
      w.lm_head = c.tie_word_embeddings ? w.embed : w.lm_head.to(device);
      move(w.final_norm);
      for (LayerWeights& lw : w.layers) {
        for (at::Tensor* t : {&lw.attn_norm, &lw.wqkv, &lw.bqkv, &lw.wo, &lw.bo, &lw.mlp_norm,
                              &lw.w_gate_up, &lw.b_gate_up, &lw.w_down, &lw.b_down}) {
          move(*t);
        }
      }
    }
    return w;
  });
}

ModelWeights ModelWeights::Dummy(const ModelConfig& c, uint64_t seed, c10::ScalarType dtype,
                                 c10::Device device, WeightFormat format) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto cpu32 = at::TensorOptions().dtype(at::kFloat);
  auto normal = [&](std::vector<int64_t> shape) {
    return at::empty(shape, cpu32).normal_(0.0, 0.02, gen).to(device, dtype);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, cpu32).to(device, dtype); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, cpu32).to(device, dtype); };
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  ModelWeights w;
  w.embed = normal({c.vocab_size, d});
  w.lm_head = c.tie_word_embeddings ? w.embed : normal({c.vocab_size, d});
  w.final_norm = ones(d);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = ones(d);
    lw.mlp_norm = ones(d);
    lw.wqkv = normal({c.q_dim() + 2 * c.kv_dim(), d});
    lw.wo = normal({d, c.q_dim()});
    lw.w_gate_up = normal({2 * f, d});
    lw.w_down = normal({d, f});
    if (c.qkv_bias) lw.bqkv = zeros(c.q_dim() + 2 * c.kv_dim());
    if (c.o_bias) lw.bo = zeros(d);
    if (c.mlp_bias) {
      lw.b_gate_up = zeros(2 * f);
      lw.b_down = zeros(d);
    }
    if (format != WeightFormat::kDense) {
      lw.Pack(format);
    } else {
      lw.MoveOntoHugePages();
    }
    w.layers.push_back(std::move(lw));
  }
  if (format != WeightFormat::kDense) {
    w.PackHead(c, format);
  } else {
    w.MoveHeadOntoHugePages(c);
  }
  return w;
}

}  // namespace scd
