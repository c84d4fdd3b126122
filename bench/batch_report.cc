#include "bench/batch_report.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "model/runtime.h"

namespace scd {

double BestSeconds(int iterations, const std::function<void()>& f) {
  f();  // warm up
  double best = 1e30;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int64_t WeightBytes(const LlamaModel& model) {
  const ModelWeights& w = model.weights();
  int64_t bytes = w.lm_head.nbytes() + w.final_norm.nbytes();  // the embedding row is one read
  for (const LayerWeights& l : w.layers) {
    for (const at::Tensor* t : {&l.attn_norm, &l.wqkv, &l.bqkv, &l.wo, &l.bo, &l.mlp_norm,
                                &l.w_gate_up, &l.b_gate_up, &l.w_down, &l.b_down}) {
      if (t->defined()) bytes += t->nbytes();
    }
  }
  return bytes;
}

double MvReadGbps() {
  at::Tensor m = at::randn({4096, 16384}), v = at::randn({16384});
  return static_cast<double>(m.nbytes()) / BestSeconds(10, [&] { at::mv(m, v); }) / 1e9;
}

namespace {

constexpr int kSteps = 8;

// Waits for the work queued before `t` on its device (nothing to wait for on the CPU): a copy of
// one element to the host waits for the stream.
void Sync(const at::Tensor& t) {
  if (!t.device().is_cpu()) (void)t.reshape({-1})[0].item();
}

// Read bandwidth of at::mv over a 1 GiB f32 matrix on a GPU, GB/s: 10 products, then one wait
// (best of 5).
double DeviceMvReadGbps(const c10::Device& device) {
  const auto options = at::TensorOptions().device(device);
  at::Tensor m = at::randn({16384, 16384}, options), v = at::randn({16384}, options);
  at::Tensor y;
  const double seconds = BestSeconds(5, [&] {
    for (int i = 0; i < 10; ++i) y = at::mv(m, v);
    Sync(y);
  });
  return 10 * static_cast<double>(m.nbytes()) / seconds / 1e9;
}

std::vector<TokenId> Ids(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<TokenId> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<TokenId>((i * 7919 + salt * 31 + 13) % vocab);
  return ids;
}

// Decode tokens/s of B sequences after `context`-token contexts: kSteps steps, either one
// ForwardBatch of B rows per step or B Forward calls. On a GPU each step (each sequence's, alone)
// ends with its greedy tokens on the host.
double DecodeRate(const LlamaModel& model, int B, bool batched, int64_t context) {
  const bool gpu = !model.device().is_cpu();
  const auto failed = [](const absl::Status& status) {
    std::fprintf(stderr, "scd_model_bench: %s\n", status.ToString().c_str());
    return 0.0;
  };
  std::vector<KvCache> caches;
  std::vector<DecodeWorkspace> workspaces;
  for (int b = 0; b < B; ++b) {
    caches.push_back(model.NewCache(context + kSteps + 1));
    workspaces.push_back(model.NewWorkspace(context + kSteps + 1));
    const std::vector<TokenId> ids = Ids(context, model.config().vocab_size, b);
    auto prefill = model.Forward(ids, &caches.back(), {.logits = LogitsMode::kNone});
    if (!prefill.ok()) return failed(prefill.status());
  }
  if (gpu) Sync(caches.back().keys(0));
  const TokenId next = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < kSteps; ++step) {
    if (batched) {
      std::vector<BatchSequence> batch;
      for (int b = 0; b < B; ++b) {
        batch.push_back({absl::MakeConstSpan(&next, 1), &caches[b], &workspaces[b], true});
      }
      auto logits = model.ForwardBatch(batch);
      if (!logits.ok()) return failed(logits.status());
      if (gpu) (void)at::cat(*logits, 0).argmax(1).to(at::kCPU);
    } else {
      for (int b = 0; b < B; ++b) {
        auto out = model.Forward({&next, 1}, &caches[b], {.workspace = &workspaces[b]});
        if (!out.ok()) return failed(out.status());
        if (gpu) (void)out->logits.argmax().item<int64_t>();
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return B * kSteps / seconds;
}

void DecodeTable(const std::string& name, const LlamaModel& model, double mv_gbps,
                 int64_t context) {
  // A model with fewer positions (tinystories-4m: 512) runs at the longest context it takes.
  context = std::min(context, model.config().max_position_embeddings - kSteps - 1);
  const double gb = static_cast<double>(WeightBytes(model)) / 1e9;
  const bool gpu = !model.device().is_cpu();
  if (gpu) {
    // Warm-up: cuBLAS handles, kernels loaded on first use, the caching allocator's pools.
    DecodeRate(model, 2, true, context);
    DecodeRate(model, 2, false, context);
    std::printf(
        "\ndecode on %s, %s, %s, %.3f GB of weights per step, after %lld-token contexts (median "
        "of 3 interleaved rounds of %d steps; every step ends with its tokens on the host):\n\n",
        model.device().str().c_str(), name.c_str(), PrecisionName(model.precision()).c_str(), gb,
        static_cast<long long>(context), kSteps);
    std::printf(
        "| B | per-sequence Forward, tok/s | ForwardBatch, tok/s | gain | batched step, ms | "
        "batched weight reads, GB/s | %% of at::mv |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf(
        "\ndecode, %s, %s, %.3f GB of weights per step, after %lld-token contexts (median of 3 "
        "interleaved rounds of %d steps):\n",
        name.c_str(), PrecisionName(model.precision()).c_str(), gb, static_cast<long long>(context),
        kSteps);
    std::printf("%4s %16s %14s %8s %18s %12s\n", "B", "per-seq tok/s", "batched tok/s", "gain",
                "batched weight GB/s", "% of at::mv");
  }
  double one = 0;
  for (int B : {1, 2, 4, 8, 16}) {
    std::vector<double> alone, together;
    for (int round = 0; round < 3; ++round) {
      alone.push_back(DecodeRate(model, B, false, context));
      together.push_back(DecodeRate(model, B, true, context));
    }
    const double a = Median(alone), t = Median(together);
    if (B == 1) one = t;
    const double gbps = t / B * gb;  // steps per second x weights per step
    if (gpu) {
      std::printf("| %d | %.1f | %.1f | %.2fx | %.2f | %.1f | %.0f%% |\n", B, a, t, t / a,
                  1e3 * B / t, gbps, 100 * gbps / mv_gbps);
    } else {
      std::printf("%4d %16.1f %14.1f %7.2fx %18.1f %11.0f%%   (%.2fx the B = 1 rate)\n", B, a, t,
                  t / a, gbps, 100 * gbps / mv_gbps, t / one);
    }
  }
  std::fflush(stdout);
}

// One layer's attention for B decoding sequences with caches of `lengths`: per sequence against
// its own cache, and padded to the longest with a mask (after copying the caches in).
void AttentionTable(const std::string& name, const ModelConfig& c,
                    const std::vector<int64_t>& lengths, const std::string& label) {
  const int64_t B = static_cast<int64_t>(lengths.size()), Hkv = c.num_kv_heads,
                g = c.group_size(), hd = c.head_dim;
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<at::Tensor> keys, values, queries;
  for (int64_t L : lengths) {
    // Storage as KvCache keeps it: [Hkv, capacity, hd], the filled part a view.
    keys.push_back(at::randn({Hkv, longest + 64, hd}).narrow(1, 0, L));
    values.push_back(at::randn({Hkv, longest + 64, hd}).narrow(1, 0, L));
    queries.push_back(at::randn({Hkv, g, hd}));
  }
  const double per_sequence = BestSeconds(20, [&] {
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor scores = at::bmm(queries[b], keys[b].transpose(1, 2));
      at::Tensor probs = at::softmax(scores, -1, at::kFloat);
      (void)at::bmm(probs, values[b]);
    }
  });
  at::Tensor K = at::zeros({B * Hkv, longest, hd}), V = at::zeros({B * Hkv, longest, hd});
  at::Tensor Q = at::cat(queries, 0);  // [B * Hkv, g, hd]
  at::Tensor hidden = at::empty({B * Hkv, 1, longest}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    hidden.narrow(0, b * Hkv, Hkv).copy_((at::arange(longest) >= lengths[b]).view({1, 1, -1}));
  }
  auto padded_attention = [&] {
    at::Tensor scores = at::bmm(Q, K.transpose(1, 2));
    scores.masked_fill_(hidden, -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1, at::kFloat);
    (void)at::bmm(probs, V);
  };
  const double padded_only = BestSeconds(20, padded_attention);
  const double padded = BestSeconds(20, [&] {
    for (int64_t b = 0; b < B; ++b) {
      K.narrow(0, b * Hkv, Hkv).narrow(1, 0, lengths[b]).copy_(keys[b]);
      V.narrow(0, b * Hkv, Hkv).narrow(1, 0, lengths[b]).copy_(values[b]);
    }
    padded_attention();
  });
  std::printf("%-18s %-22s %3lld %14.1f %14.1f %20.1f %8.2fx\n", name.c_str(), label.c_str(),
              static_cast<long long>(B), per_sequence * 1e6, padded * 1e6, padded_only * 1e6,
              padded / per_sequence);
}

}  // namespace

int BatchReport(const std::string& configs, const BatchReportOptions& options) {
  const bool gpu = !options.device.is_cpu();
  const double mv_gbps = gpu ? DeviceMvReadGbps(options.device) : MvReadGbps();
  std::printf("read bandwidth: at::mv %s f32 %.1f GB/s\n",
              gpu ? absl::StrCat("16384x16384 on ", options.device.str()).c_str() : "4096x16384",
              mv_gbps);
  struct Shape {
    std::string name, file;
    int64_t layers;
  };
  const int64_t cut = options.tinyllama_layers;
  const std::vector<Shape> shapes = {
      {cut > 0 ? absl::StrCat("tinyllama-1.1b-", cut, "L") : "tinyllama-1.1b",
       configs + "/tinyllama-1.1b.json", cut},
      {"tinystories-4m", configs + "/../models/tinystories-4m/config.json", 0}};
  std::vector<std::unique_ptr<LlamaModel>> models;
  for (const Shape& shape : shapes) {
    for (const Precision& precision : options.dtypes) {
      LlamaModel::Options model_options;
      model_options.device = options.device;
      model_options.dtype = precision.dtype;
      model_options.weights = precision.weights;
      auto model = LlamaModel::DummyFromConfig(shape.file, 1, shape.layers, model_options);
      if (!model.ok()) {
        std::fprintf(stderr, "scd_model_bench: %s\n",
                     std::string(model.status().message()).c_str());
        return 1;
      }
      DecodeTable(shape.name, **model, mv_gbps, options.context);
      if (!gpu && &precision == &options.dtypes.front()) models.push_back(*std::move(model));
    }
  }
  if (gpu) return 0;  // the attention layouts below are measured on the CPU's tensors
  std::printf(
      "\nattention of one layer for B decoding sequences, microseconds (best of 20): per sequence "
      "against its own cache (ForwardBatch) vs padded to the longest + mask, with the copy into "
      "the padded tensor and without it\n");
  std::printf("%-18s %-22s %3s %14s %14s %20s %9s\n", "shape", "cache lengths", "B",
              "per-sequence", "padded", "padded, no copy", "padded/");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ModelConfig& c = models[i]->config();
    const int64_t most = std::min<int64_t>(1024, c.max_position_embeddings);
    for (int B : {4, 8, 16}) {
      std::vector<int64_t> mixed, uniform(B, most / 2);
      for (int b = 0; b < B; ++b) mixed.push_back(16 + (b * 389) % (most - 16));
      AttentionTable(shapes[i].name, c, mixed, absl::StrCat("mixed 16..", most));
      AttentionTable(shapes[i].name, c, uniform, absl::StrCat("all ", most / 2));
    }
  }
  return 0;
}

}  // namespace scd
