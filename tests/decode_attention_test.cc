// DecodeAttention (model/decode_attention.h) against a float64 softmax attention: one query row
// per kv head and group member against a cache layer's keys and values read in place (a head
// stride larger than the keys held, as a KvCache's storage has), head sizes 8 and 64, one to a
// thousand keys. The bound: the scores are hd-term dot products (gamma_hd sum |q k|, Higham
// (3.4)); exp and the normalisation add a few ulps; the output is an L-term convex combination of
// the values, so its error is at most the score error's effect on the weights (|dp| <= p |ds|
// times 2) times max |v| plus gamma_L max |v|.
#include "model/decode_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace scd {
namespace {

TEST(DecodeAttentionTest, MatchesFloat64AttentionOnACacheLayout) {
  for (int64_t hd : {8, 64}) {
    if (!DecodeAttentionAvailable(hd)) GTEST_SKIP() << "no AVX2 + FMA here: ATen is used";
    at::manual_seed(3);
    const int64_t H = 2, g = 4, capacity = 1100;
    for (int64_t L : {1, 7, 8, 9, 130, 1000}) {
      at::Tensor keys = at::randn({H, capacity, hd}), values = at::randn({H, capacity, hd});
      const int64_t first = L > 8 ? 3 : 0;  // a window: the visible keys start later
      at::Tensor q = at::randn({H, g, hd}) / std::sqrt(static_cast<double>(hd));
      at::Tensor out = at::empty({H, g, hd});
      DecodeAttentionArgs args;
      args.q = q.data_ptr<float>();
      args.keys = keys.data_ptr<float>() + first * hd;
      args.values = values.data_ptr<float>() + first * hd;
      args.head_stride = capacity * hd;
      args.kv_heads = H;
      args.group = g;
      args.head_dim = hd;
      args.length = L;
      args.out = out.data_ptr<float>();
      DecodeAttention(args);
      at::Tensor k = keys.narrow(1, first, L).to(at::kDouble);
      at::Tensor v = values.narrow(1, first, L).to(at::kDouble);
      at::Tensor scores = at::bmm(q.to(at::kDouble), k.transpose(1, 2));  // [H, g, L]
      at::Tensor exact = at::bmm(at::softmax(scores, -1), v);
      const double score_error =
          testing::Float32Gamma(hd) *
          at::bmm(q.to(at::kDouble).abs(), k.abs().transpose(1, 2)).max().item<double>();
      const double vmax = v.abs().max().item<double>();
      const double bound =
          (2 * (score_error + 8 * testing::kFloat32Epsilon) + testing::Float32Gamma(L)) * vmax;
      EXPECT_LE((out.to(at::kDouble) - exact).abs().max().item<double>(), bound)
          << "hd " << hd << " L " << L;
    }
  }
}

}  // namespace
}  // namespace scd
