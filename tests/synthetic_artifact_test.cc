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
