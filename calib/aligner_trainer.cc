#include "calib/aligner_trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace scd {

std::string AlignerTrainReport::ToJson() const {
  nlohmann::json j = {{"train_rows", train_rows},
                      {"heldout_rows", heldout_rows},
                      {"linear_heldout_loss", linear_heldout},
                      {"heldout_loss", heldout},
                      {"epochs", epochs},
                      {"seconds", seconds}};
  return j.dump();
}

absl::StatusOr<PatchAligner> TrainAligner(const ReuseTranslator& basis, const at::Tensor& h_a,
                                          const at::Tensor& h_b, const at::Tensor& kv_weight,
                                          const AlignerTrainOptions& options,
                                          AlignerTrainReport* report,
                                          const std::function<void(int, double)>& on_epoch) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = h_a.size(0);
  if (n < 16 || h_b.size(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat("aligner training needs paired rows, got ", n));
  }
  torch::NoGradGuard no_grad_outside;
  torch::manual_seed(options.seed);
  // Inputs: the code as transmitted; targets: what the linear decode leaves over.
  at::Tensor z = basis.Encode(h_a, basis.rank()).detach();                // [n, r]
  at::Tensor residual = (h_b.to(at::kFloat) - basis.Decode(z)).detach();  // [n, hidden]
  at::Tensor z_scale = z.std(0).clamp_min(1e-6);
  at::Tensor x = z / z_scale;
  // The loss metric: e -> e P^T with P = [W_k; W_v] (key-value loss) or the identity.
  at::Tensor proj = options.loss == AlignerTrainOptions::Loss::kKeyValue
                        ? kv_weight.to(at::kCPU, at::kFloat).t().contiguous()  // [hidden, 2 kv]
                        : at::Tensor();
  auto metric = [&](const at::Tensor& e) { return proj.defined() ? e.mm(proj) : e; };
  at::Tensor target = metric(residual);
  // Split rows into train / held-out with a fixed permutation.
  at::Tensor perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong));
  const int64_t heldout_n = std::max<int64_t>(8, static_cast<int64_t>(n * options.holdout));
  at::Tensor held_idx = perm.narrow(0, 0, heldout_n),
             train_idx = perm.narrow(0, heldout_n, n - heldout_n);
  at::Tensor x_train = x.index_select(0, train_idx), t_train = target.index_select(0, train_idx);
  at::Tensor x_held = x.index_select(0, held_idx), t_held = target.index_select(0, held_idx);

  const int64_t hidden = residual.size(1);
  torch::nn::Sequential mlp;
  int64_t in = z.size(1);
  for (int64_t i = 0; i < options.shape.depth; ++i) {
    mlp->push_back(torch::nn::Linear(in, options.shape.width));
    mlp->push_back(torch::nn::SiLU());
    in = options.shape.width;
  }
  torch::nn::Linear out_layer(in, hidden);
  {  // start from the linear aligner: the correction is zero until training moves it
    out_layer->weight.zero_();
    out_layer->bias.zero_();
  }
  mlp->push_back(out_layer);
  auto held_loss = [&]() {
    torch::NoGradGuard g;
    return (metric(mlp->forward(x_held)) - t_held).pow(2).mean().item<double>();
  };
  report->train_rows = x_train.size(0);
  report->heldout_rows = heldout_n;
  report->linear_heldout = t_held.pow(2).mean().item<double>();

  torch::optim::Adam optimizer(
      mlp->parameters(), torch::optim::AdamOptions(options.lr).weight_decay(options.weight_decay));
  const int64_t batch = std::min<int64_t>(options.batch, x_train.size(0));
  const int64_t steps_per_epoch = std::max<int64_t>(1, x_train.size(0) / batch);
  const int64_t total_steps = steps_per_epoch * options.max_epochs;
  const int64_t warmup = std::max<int64_t>(1, total_steps / 50);
  double best = held_loss();
  std::vector<at::Tensor> best_params;
  for (const auto& p : mlp->parameters()) best_params.push_back(p.detach().clone());
  int since_best = 0;
  int64_t step = 0;
  int epoch = 0;
  for (; epoch < options.max_epochs; ++epoch) {
    at::Tensor order = torch::randperm(x_train.size(0), torch::TensorOptions().dtype(torch::kLong));
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
      const double progress = static_cast<double>(step) / total_steps;
      const double lr = step < warmup ? options.lr * (step + 1) / warmup
                                      : options.lr * 0.5 * (1 + std::cos(M_PI * progress));
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
      }
      at::Tensor idx = order.narrow(0, b * batch, batch);
      torch::AutoGradMode enable(true);
      optimizer.zero_grad();
      at::Tensor loss =
          (metric(mlp->forward(x_train.index_select(0, idx))) - t_train.index_select(0, idx))
              .pow(2)
              .mean();
      loss.backward();
      optimizer.step();
    }
    const double h = held_loss();
    if (on_epoch) on_epoch(epoch, h);
    if (h < best * (1 - 1e-4)) {
      best = h;
      since_best = 0;
      size_t i = 0;
      for (const auto& p : mlp->parameters()) best_params[i++].copy_(p.detach());
    } else if (++since_best >= options.patience) {
      ++epoch;
      break;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > options.max_seconds) {
      ++epoch;
      break;
    }
  }
  report->heldout = best;
  report->epochs = epoch;
  report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<at::Tensor> weights, biases;
  size_t i = 0;
  for (const auto& p : mlp->parameters()) {
    (p.dim() == 2 ? weights : biases).push_back(best_params[i++]);
  }
  return PatchAligner::Create(basis, z_scale, weights, biases);
}

}  // namespace scd
