#include "calib/aligner_trainer.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/timer.h"

namespace scd {

namespace {

// Inputs (the code as transmitted, scaled) and targets (what the linear decode leaves over,
// under the loss metric), split into train and held-out rows with a fixed permutation.
struct AlignerData {
  at::Tensor z_scale;
  at::Tensor proj;   // e -> e proj: [W_k; W_v]^T (key-value loss) or undefined (identity)
  at::Tensor w_dec;  // [rank, hidden]: the basis's linear decode rows (nested training)
  at::Tensor x_train, t_train, x_held, t_held;
  int64_t hidden = 0;

  at::Tensor Metric(const at::Tensor& e) const { return proj.defined() ? e.mm(proj) : e; }
};

AlignerData PrepareData(const ReuseTranslator& basis, const at::Tensor& h_a, const at::Tensor& h_b,
                        const at::Tensor& kv_weight, const AlignerTrainOptions& options) {
  AlignerData d;
  const int64_t n = h_a.size(0);
  at::Tensor z = basis.Encode(h_a, basis.rank()).detach();                // [n, r]
  at::Tensor residual = (h_b.to(at::kFloat) - basis.Decode(z)).detach();  // [n, hidden]
  d.hidden = residual.size(1);
  d.w_dec = basis.w_dec().select(0, 0).to(at::kCPU, at::kFloat);
  d.z_scale = z.std(0).clamp_min(1e-6);
  at::Tensor x = z / d.z_scale;
  if (options.loss == AlignerTrainOptions::Loss::kKeyValue) {
    d.proj = kv_weight.to(at::kCPU, at::kFloat).t().contiguous();  // [hidden, 2 kv]
  }
  at::Tensor target = d.Metric(residual);
  at::Tensor perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong));
  const int64_t heldout_n = std::max<int64_t>(8, static_cast<int64_t>(n * options.holdout));
  at::Tensor held_idx = perm.narrow(0, 0, heldout_n),
             train_idx = perm.narrow(0, heldout_n, n - heldout_n);
  d.x_train = x.index_select(0, train_idx);
  d.t_train = target.index_select(0, train_idx);
  d.x_held = x.index_select(0, held_idx);
  d.t_held = target.index_select(0, held_idx);
  return d;
}

// SiLU MLP whose output layer starts at zero: the correction is zero until training moves it,
// so the aligner starts as the linear decode.
torch::nn::Sequential MakeMlp(int64_t in, int64_t out, const AlignerShape& shape) {
  torch::nn::Sequential mlp;
  for (int64_t i = 0; i < shape.depth; ++i) {
    mlp->push_back(torch::nn::Linear(in, shape.width));
    mlp->push_back(torch::nn::SiLU());
    in = shape.width;
  }
  torch::nn::Linear out_layer(in, out);
  out_layer->weight.zero_();
  out_layer->bias.zero_();
  mlp->push_back(out_layer);
  return mlp;
}

// Adam with a linear warmup (2 % of the steps) and a cosine decay.
class AlignerOptimizer {
 public:
  AlignerOptimizer(torch::nn::Sequential mlp, const AlignerData& data,
                   const AlignerTrainOptions& options)
      : mlp_(mlp),
        data_(data),
        options_(options),
        adam_(mlp->parameters(),
              torch::optim::AdamOptions(options.lr).weight_decay(options.weight_decay)),
        batch_(std::min<int64_t>(options.batch, data.x_train.size(0))),
        steps_per_epoch_(std::max<int64_t>(1, data.x_train.size(0) / batch_)),
        total_steps_(steps_per_epoch_ * options.max_epochs),
        warmup_(std::max<int64_t>(1, total_steps_ / 50)) {}

  void Epoch() {
    at::Tensor order =
        torch::randperm(data_.x_train.size(0), torch::TensorOptions().dtype(torch::kLong));
    for (int64_t b = 0; b < steps_per_epoch_; ++b, ++step_) {
      const double progress = static_cast<double>(step_) / total_steps_;
      const double lr = step_ < warmup_ ? options_.lr * (step_ + 1) / warmup_
                                        : options_.lr * 0.5 * (1 + std::cos(M_PI * progress));
      for (auto& group : adam_.param_groups()) {
        static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
      }
      at::Tensor idx = order.narrow(0, b * batch_, batch_);
      at::Tensor x = data_.x_train.index_select(0, idx), t = data_.t_train.index_select(0, idx);
      if (options_.nested_min_rank > 0 && options_.nested_min_rank < x.size(1)) {
        const int64_t r = x.size(1);
        at::Tensor keep = at::randint(options_.nested_min_rank, r + 1, {x.size(0), 1},
                                      at::TensorOptions().dtype(at::kLong));
        keep = at::where(at::rand({x.size(0), 1}) < 0.5, keep, at::full_like(keep, r));
        at::Tensor mask = (at::arange(r, at::TensorOptions().dtype(at::kLong)).unsqueeze(0) < keep)
                              .to(at::kFloat);
        Truncate(mask, &x, &t);
      }
      torch::AutoGradMode enable(true);
      adam_.zero_grad();
      at::Tensor loss = (data_.Metric(mlp_->forward(x)) - t).pow(2).mean();
      loss.backward();
      adam_.step();
    }
  }

  double HeldoutLoss() {
    torch::NoGradGuard g;
    const int64_t r = data_.x_held.size(1);
    if (options_.nested_min_rank <= 0 || options_.nested_min_rank >= r) return HeldoutLoss(r);
    const int64_t low = options_.nested_min_rank;
    return (HeldoutLoss(low) + HeldoutLoss((low + r) / 2) + HeldoutLoss(r)) / 3;
  }

 private:
  // Rows whose code keeps only the columns `mask` [n, r] marks: inputs zeroed there, targets
  // grown by what the linear decode of the dropped columns would have given.
  void Truncate(const at::Tensor& mask, at::Tensor* x, at::Tensor* t) const {
    at::Tensor dropped = *x * data_.z_scale * (1 - mask);  // codes as sent, dropped columns
    *t = *t + data_.Metric(dropped.mm(data_.w_dec));
    *x = *x * mask;
  }
  double HeldoutLoss(int64_t rank) {
    at::Tensor x = data_.x_held, t = data_.t_held;
    if (rank < x.size(1)) {
      at::Tensor mask = (at::arange(x.size(1), at::TensorOptions().dtype(at::kLong)) < rank)
                            .to(at::kFloat)
                            .unsqueeze(0)
                            .expand({x.size(0), x.size(1)});
      Truncate(mask, &x, &t);
    }
    return (data_.Metric(mlp_->forward(x)) - t).pow(2).mean().item<double>();
  }

  torch::nn::Sequential mlp_;
  const AlignerData& data_;
  const AlignerTrainOptions& options_;
  torch::optim::Adam adam_;
  int64_t batch_, steps_per_epoch_, total_steps_, warmup_;
  int64_t step_ = 0;
};

}  // namespace

absl::StatusOr<PatchAligner> TrainAligner(const ReuseTranslator& basis, const at::Tensor& h_a,
                                          const at::Tensor& h_b, const at::Tensor& kv_weight,
                                          const AlignerTrainOptions& options,
                                          AlignerTrainReport* report,
                                          const std::function<void(int, double)>& on_epoch) {
  return GuardExceptions("TrainAligner", [&]() -> absl::StatusOr<PatchAligner> {
    const Stopwatch watch;
    const int64_t n = h_a.size(0);
    if (n < 16 || h_b.size(0) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("aligner training needs paired rows, got ", n));
    }
    torch::NoGradGuard no_grad_outside;
    torch::manual_seed(options.seed);
    const AlignerData data = PrepareData(basis, h_a, h_b, kv_weight, options);
    torch::nn::Sequential mlp = MakeMlp(basis.rank(), data.hidden, options.shape);
    report->train_rows = data.x_train.size(0);
    report->heldout_rows = data.x_held.size(0);
    report->linear_heldout = data.t_held.pow(2).mean().item<double>();
    AlignerOptimizer optimizer(mlp, data, options);
    double best = optimizer.HeldoutLoss();
    std::vector<at::Tensor> best_params;
    for (const auto& p : mlp->parameters()) best_params.push_back(p.detach().clone());
    int since_best = 0, epoch = 0;
    while (epoch < options.max_epochs) {
      optimizer.Epoch();
      const double h = optimizer.HeldoutLoss();
      if (on_epoch) on_epoch(epoch, h);
      ++epoch;
      if (h < best * (1 - 1e-4)) {  // keep the best held-out weights
        best = h;
        since_best = 0;
        size_t i = 0;
        for (const auto& p : mlp->parameters()) best_params[i++].copy_(p.detach());
      } else if (++since_best >= options.patience) {
        break;
      }
      if (options.max_seconds > 0 && watch.Seconds() > options.max_seconds) break;
    }
    report->heldout = best;
    report->epochs = epoch;
    report->seconds = watch.Seconds();
    std::vector<at::Tensor> weights, biases;
    size_t i = 0;
    for (const auto& p : mlp->parameters()) {
      (p.dim() == 2 ? weights : biases).push_back(best_params[i++]);
    }
    return PatchAligner::Create(basis, data.z_scale, weights, biases);
  });
}

}  // namespace scd
