// SynthesizeArtifact: orthonormal encoders and decoders at the requested ranks, patch layers
// where asked, an artifact that saves, loads for its pair and drives the scd transfer path; and
// clear errors for pairs or ranks that cannot work. `scd-calib synth` writes the same from the
// command line.
#include "calib/synthetic_artifact.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "codec/transfer.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

std::string Config(const std::string& name) {
  return testing::SharedDir() + "/configs/" + name + ".json";
}

// max |W^T W - I| over maps, for W [maps, dim, rank].
double OrthonormalityError(const at::Tensor& w) {
  const at::Tensor gram = at::bmm(w.transpose(1, 2), w);
  return (gram - at::eye(w.size(2)).expand_as(gram)).abs().max().item<double>();
}

TEST(SyntheticArtifactTest, OrthonormalTranslatorsAtTheRequestedRanksDriveTheScdPath) {
  auto producer = testing::Ok(LlamaModel::DummyFromConfig(Config("smollm2-135m"), 1, 3, {}));
  auto consumer = testing::Ok(LlamaModel::DummyFromConfig(Config("smollm2-135m"), 2, 3, {}));
  SyntheticArtifactOptions options;
  options.key_rank = 8;
  options.value_rank = 12;
  options.patch_layers = {1};
  options.patch_rank = 24;
  Artifact artifact = testing::Ok(SynthesizeArtifact(*producer, *consumer, options));
  ASSERT_EQ(artifact.layers.size(), 3u);
  EXPECT_EQ(artifact.PatchLayers(), std::vector<int>{1});
  EXPECT_EQ(artifact.fit_method, "synthetic");
  const int64_t heads = producer->config().num_kv_heads;
  for (const ArtifactLayer& layer : artifact.layers) {
    EXPECT_EQ(layer.key.rank(), 8);
    EXPECT_EQ(layer.value.rank(), 12);
    EXPECT_EQ(layer.key.maps(), heads);
    EXPECT_LT(OrthonormalityError(layer.key.w_enc()), 1e-4);
    EXPECT_LT(OrthonormalityError(layer.value.w_dec().transpose(1, 2)), 1e-4);
  }
  ASSERT_TRUE(artifact.layers[1].patch.has_value());
  EXPECT_EQ(artifact.layers[1].patch->rank(), 24);
  EXPECT_TRUE(artifact.layers[1].patch->weights().empty());  // linear aligner

  testing::TempDir dir;
  ASSERT_TRUE(artifact.Save(dir.File("synth.scd")).ok());
  Artifact loaded = testing::Ok(Artifact::LoadFor(dir.File("synth.scd"), *producer, *consumer));
  const std::vector<TokenId> prefix = {1, 40, 900, 77, 3, 12000, 5};
  KvCache cache = consumer->NewCache(16);
  TransferPath path = testing::Ok(
      TransferPath::Create(TransferMode::kScd, *producer, *consumer, &loaded, TransferOptions()));
  ASSERT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
  EXPECT_EQ(cache.length(0), static_cast<int64_t>(prefix.size()));
}

// The synthetic frontier (timing benches of auto mode): nested points of every precision, bytes
// as the codec sends them, KL falling with bytes, the fitted configuration on top; it saves and
// loads with the artifact.
TEST(SyntheticArtifactTest, AFrontierWhoseBytesAreTheCodecs) {
  auto producer = testing::Ok(LlamaModel::DummyFromConfig(Config("smollm2-135m"), 1, 3, {}));
  auto consumer = testing::Ok(LlamaModel::DummyFromConfig(Config("smollm2-135m"), 2, 3, {}));
  SyntheticArtifactOptions options{.key_rank = 8, .value_rank = 8, .patch_layers = {1},
                                   .patch_rank = 32, .recompute_layers = {}, .seed = 0};
  Artifact artifact = testing::Ok(SynthesizeArtifact(*producer, *consumer, options));
  SyntheticFrontierOptions frontier_options;
  frontier_options.probe_tokens = 33;
  artifact.frontier =
      testing::Ok(SynthesizeFrontier(*producer, *consumer, artifact, frontier_options));
  const Frontier& f = artifact.frontier;
  ASSERT_GE(f.points.size(), 3u);
  const FrontierPoint& top = f.points.back();
  EXPECT_EQ(top.code_dtype, WireDtype::kF16);
  EXPECT_EQ(top.rank_k, (std::vector<int64_t>{8, 0, 8}));
  EXPECT_EQ(top.rank_h, (std::vector<int64_t>{0, 32, 0}));
  EXPECT_DOUBLE_EQ(top.kl, frontier_options.full_kl);
  for (size_t i = 1; i < f.points.size(); ++i) {
    EXPECT_LT(f.points[i - 1].bytes_per_token, f.points[i].bytes_per_token) << i;
    EXPECT_GT(f.points[i - 1].kl, f.points[i].kl) << i;
    EXPECT_TRUE(f.points[i - 1].NestedIn(top) || f.points[i - 1].code_dtype != WireDtype::kF16);
  }
  ASSERT_GE(f.recommended, 0);
  EXPECT_LE(f.points[f.recommended].kl, 1.25 * top.kl);
  EXPECT_THAT(f.heldout, HasSubstr("made up"));
  // Each point's bytes are what the codec sends at it: an f16 point at full ranks is 2 bytes per
  // code element (3 K/V layers' ranks x kv heads x 2, plus the patch layer's 32).
  const int64_t heads = producer->config().num_kv_heads;
  EXPECT_DOUBLE_EQ(top.bytes_per_token, 2.0 * (2 * (8 + 8) * heads + 32));
  testing::TempDir dir;
  ASSERT_TRUE(artifact.Save(dir.File("synth.scd")).ok());
  const Artifact loaded = testing::Ok(Artifact::Load(dir.File("synth.scd")));
  EXPECT_EQ(loaded.frontier.points.size(), f.points.size());
  // Fractions outside (0, 1] are refused.
  frontier_options.fractions = {0.5, 0};
  EXPECT_THAT(SynthesizeFrontier(*producer, *consumer, artifact, frontier_options).status().message(),
              HasSubstr("fraction 0"));
}

TEST(SyntheticArtifactTest, RefusesPairsAndRanksThatCannotWork) {
  auto tiny = testing::Ok(LlamaModel::DummyFromConfig(Config("smollm2-135m"), 1, 2, {}));
  auto other = testing::Ok(LlamaModel::DummyFromConfig(Config("qwen2.5-0.5b"), 1, 2, {}));
  EXPECT_THAT(SynthesizeArtifact(*tiny, *other, {}).status().message(),
              HasSubstr("must share layers, kv heads and head dim"));
  SyntheticArtifactOptions too_wide;
  too_wide.key_rank = tiny->config().head_dim + 1;
  EXPECT_THAT(SynthesizeArtifact(*tiny, *tiny, too_wide).status().message(), HasSubstr("key rank"));
  SyntheticArtifactOptions bad_layer;
  bad_layer.patch_layers = {2};
  EXPECT_THAT(SynthesizeArtifact(*tiny, *tiny, bad_layer).status().message(),
              HasSubstr("patch layer 2 is outside [0, 2)"));
  EXPECT_FALSE(LlamaModel::DummyFromConfig(Config("no-such-model"), 1, 0, {}).ok());
}

}  // namespace
}  // namespace scd
