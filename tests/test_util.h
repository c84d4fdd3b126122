// Shared helpers for model tests: goldens from ../shared/golden and tensor comparison, on top of
// the torch-free helpers of test_files.h.
#ifndef SCD_TESTS_TEST_UTIL_H_
#define SCD_TESTS_TEST_UTIL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/token_id.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "tests/test_files.h"

namespace scd::testing {

// All real checkpoints in ../shared/models that have goldens.
const std::vector<std::string>& GoldenModelNames();

struct GoldenPrompt {
  std::string text;
  std::vector<TokenId> ids;        // BOS included
  std::vector<TokenId> greedy_40;  // 40 greedy tokens after ids
};

// ../shared/golden/NAME.{json,safetensors}: prompts, float64-reference logits p{i}.logits and,
// for prompt 2, per-layer captures p2.layer{l}.{attn_input,key_prerope,value}.
struct Golden {
  std::string model;
  std::vector<GoldenPrompt> prompts;
  std::unique_ptr<SafetensorsFile> tensors;
  at::Tensor Tensor(const std::string& name) const;  // float32; fails the test when absent
};
Golden LoadGolden(const std::string& model_name);
// Golden prompt `index` continued by its 40 greedy tokens (real text, the model's own
// distribution), cut to `length` ids.
std::vector<TokenId> GoldenContinuation(const std::string& model_name, int index, size_t length);

// The device the model tests that take one run on: $SCD_TEST_DEVICE, "cpu" when unset ("cuda",
// "cuda:N": model and caches on that GPU, the same assertions). An error when that device is not
// usable here (no CUDA in this libtorch, no GPU): the test fails, it does not fall back.
absl::StatusOr<c10::Device> TestDevice();

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b);
// max |actual - expected| / max |expected|: the largest error relative to the magnitude compared
// (the plain difference when `expected` is all zeros). Float32 results that differ only in the
// order of their operations agree to a few units of float32 epsilon (1.2e-7) times the number
// of accumulated terms, relative to that magnitude (bounds are written next to each use).
double MaxRelDiff(const at::Tensor& actual, const at::Tensor& expected);
inline constexpr double kFloat32Epsilon = 1.1920929e-7;

// gamma_n = n u / (1 - n u) with u = 2^-24 (float32 unit roundoff): the bound on the relative
// error of an n-term float32 sum or dot product in ANY summation order, blocked, vectorised,
// with or without FMA (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., (3.4)):
// |fl(x.y) - x.y| <= gamma_n |x|.|y|. Differences between BLAS kernels live inside it.
double Float32Gamma(int64_t n);
// max over elements of |actual - expected| / bound, with `bound` (broadcastable, > 0) the
// element-wise error bound derived beside the comparison: <= 1 when every element is within it.
double MaxBoundRatio(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound);

// A random but well-formed artifact for a model shaped like stories260k (fitted "for" the model
// with itself): ranks (r_K, r_V) = (2, 3) everywhere, patch layers 1 and 3 with r_H = 5 and a
// one-hidden-layer aligner, recompute plan {2, 3}.
Artifact SyntheticArtifact(const LlamaModel& model);

// Every field of two code chunks equal and their tensors bit-identical (gtest expectations
// tagged with `where`).
void ExpectSameChunk(const CodeChunk& a, const CodeChunk& b, const std::string& where);

// Two caches of the same layers, lengths, keys and values, bit for bit (tagged with `where`).
void ExpectSameCache(const KvCache& a, const KvCache& b, const std::string& where = "");

}  // namespace scd::testing

#endif  // SCD_TESTS_TEST_UTIL_H_
