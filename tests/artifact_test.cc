// Artifacts: exact round trips, and clear errors for the wrong models (fingerprints), truncated
// or corrupted files, unknown versions and files that are not artifacts at all.
#include "codec/artifact.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "tests/test_util.h"

namespace scd {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class ArtifactTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = LlamaModel::Load(testing::ModelDir("stories260k"), {});
    auto other = LlamaModel::Load(testing::ModelDir("stories260k-fables"), {});
    ASSERT_TRUE(model.ok() && other.ok());
    model_ = std::move(*model);
    other_ = std::move(*other);
    artifact_ = testing::SyntheticArtifact(*model_);
    artifact_.fit_method = "rrr";
    artifact_.calibration_json = R"({"prefixes": 7})";
    artifact_.fidelity_json = R"({"scd": {"kl": 0.5}})";
    path_ = dir_.File("pair.scd");
    ASSERT_TRUE(artifact_.Save(path_).ok());
  }
  std::unique_ptr<LlamaModel> model_, other_;
  Artifact artifact_;
  testing::TempDir dir_;
  std::string path_;
};

TEST_F(ArtifactTest, RoundTripsExactly) {
  auto loaded = Artifact::LoadFor(path_, *model_, *model_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->PatchLayers(), (std::vector<int>{1, 3}));
  EXPECT_EQ(loaded->recompute_layers, (std::vector<int>{2, 3}));
  EXPECT_EQ(loaded->producer.fingerprint, artifact_.producer.fingerprint);
  EXPECT_EQ(loaded->consumer.rope, artifact_.consumer.rope);
  EXPECT_EQ(loaded->fit_method, "rrr");
  EXPECT_NE(loaded->calibration_json.find("\"prefixes\":7"), std::string::npos);
  for (size_t l = 0; l < artifact_.layers.size(); ++l) {
    const ArtifactLayer &a = artifact_.layers[l], &b = loaded->layers[l];
    EXPECT_EQ(a.route, b.route);
    EXPECT_TRUE(at::equal(a.key.w_enc(), b.key.w_enc()));
    EXPECT_TRUE(at::equal(a.value.w_dec(), b.value.w_dec()));
    EXPECT_TRUE(at::equal(a.key.mu_b(), b.key.mu_b()));
    ASSERT_EQ(a.patch.has_value(), b.patch.has_value());
    if (a.patch) {
      at::Tensor z = at::randn({4, 5});
      EXPECT_TRUE(at::equal(a.patch->Align(z), b.patch->Align(z)));
    }
  }
  // The same codes come out of the loaded artifact.
  const std::vector<TokenId> prefix = testing::LoadGolden("stories260k").prompts[2].ids;
  auto plan = testing::Ok(TransferPlan::Make(TransferMode::kScd, model_->config(), &artifact_, {}));
  auto a = testing::Ok(CodeEncoder(plan, &artifact_, {}).Prefill(*model_, prefix));
  auto b = testing::Ok(CodeEncoder(plan, &*loaded, {}).Prefill(*model_, prefix));
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i)
    EXPECT_TRUE(at::equal(a.chunks[i].data, b.chunks[i].data));
}

// The consumer precision an artifact was fitted at travels with it; a consumer serving at another
// precision is told which, what was measured at fit time, and how to fit one at its own.
TEST_F(ArtifactTest, RecordsTheConsumerPrecisionItWasFittedAt) {
  EXPECT_EQ(testing::Ok(Artifact::Load(path_)).consumer.precision, "f32");
  LlamaModel::Options int8;
  int8.weights = WeightFormat::kInt8;
  const auto packed = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), int8));
  EXPECT_EQ(testing::Ok(ModelIdentity::Of(*packed)).precision, "int8");
  Artifact at_int8 = artifact_;
  at_int8.consumer.precision = "int8";
  ASSERT_TRUE(at_int8.Save(dir_.File("int8.scd")).ok());
  const Artifact loaded = testing::Ok(Artifact::Load(dir_.File("int8.scd")));
  EXPECT_EQ(loaded.consumer.precision, "int8");
  EXPECT_EQ(loaded.producer.precision, "f32");
  EXPECT_TRUE(CheckConsumerPrecision(loaded, "int8").ok());
  const absl::Status mismatch = CheckConsumerPrecision(loaded, "f32");
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(mismatch, "fitted at int8 weights, this node serves f32")) << mismatch;
  EXPECT_TRUE(Contains(mismatch, "KL 0.5")) << mismatch;  // the fidelity recorded at fit time
  EXPECT_TRUE(Contains(mismatch, "scd-calib eval --consumer-dtype f32 --record")) << mismatch;
  // The same fingerprints: weights are the same files whatever the precision.
  EXPECT_TRUE(loaded.CheckModels(*model_, *packed).ok());

  // Measured at another precision (scd-calib eval --record): accepted there, and only there.
  Artifact measured = artifact_;  // fitted at f32
  EXPECT_FALSE(CheckConsumerPrecision(measured, "int8").ok());
  measured.Record({"int8", 0.034, 144, 1.02, 60, "tinystories_valid_hf.txt"});
  measured.Record({"int8", 0.032, 144, 1.02, 60, "tinystories_valid_hf.txt"});  // replaces
  ASSERT_TRUE(measured.Save(dir_.File("measured.scd")).ok());
  const Artifact back = testing::Ok(Artifact::Load(dir_.File("measured.scd")));
  ASSERT_EQ(back.measured.size(), 1u);
  ASSERT_NE(back.MeasuredAt("int8"), nullptr);
  EXPECT_EQ(back.MeasuredAt("int8")->kl, 0.032);
  EXPECT_EQ(back.MeasuredAt("int8")->windows, 60);
  EXPECT_TRUE(CheckConsumerPrecision(back, "int8").ok());
  EXPECT_TRUE(CheckConsumerPrecision(back, "f32").ok());
  EXPECT_FALSE(CheckConsumerPrecision(back, "bf16").ok());
  EXPECT_TRUE(testing::Ok(Artifact::Load(path_)).measured.empty());
}

TEST_F(ArtifactTest, OtherModelsAreRefusedByFingerprint) {
  auto wrong_consumer = Artifact::LoadFor(path_, *model_, *other_);
  EXPECT_EQ(wrong_consumer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(wrong_consumer.status(), "artifact was fitted for consumer 'stories260k'"))
      << wrong_consumer.status();
  EXPECT_TRUE(Contains(wrong_consumer.status(), "refit")) << wrong_consumer.status();
  auto wrong_producer = Artifact::LoadFor(path_, *other_, *model_);
  EXPECT_TRUE(Contains(wrong_producer.status(), "fitted for producer")) << wrong_producer.status();
  // Fingerprints see every weight byte: one changed element changes it.
  ModelWeights w = ModelWeights::Dummy(model_->config(), 1, at::kFloat, at::kCPU);
  auto m1 = LlamaModel::FromWeights(model_->config(), w, {});
  std::string f1 = testing::Ok(FingerprintModel(*m1));
  w.layers[2].w_down[0][0] += 1e-3;
  EXPECT_NE(*FingerprintModel(*LlamaModel::FromWeights(model_->config(), w, {})), f1);
  EXPECT_EQ(testing::Ok(FingerprintModelDir(testing::ModelDir("stories260k"))),
            testing::Ok(FingerprintModel(*model_)));
}

TEST_F(ArtifactTest, TruncatedFileIsRefused) {
  std::string bytes = testing::ReadFile(path_);
  testing::WriteFile(path_, bytes.substr(0, bytes.size() * 2 / 3));
  auto a = Artifact::Load(path_);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(a.status(), "invalid safetensors file")) << a.status();
}

TEST_F(ArtifactTest, CorruptedTensorBytesFailTheChecksum) {
  std::string bytes = testing::ReadFile(path_);
  bytes[bytes.size() - 10] ^= 0x40;  // inside the last tensor's data
  testing::WriteFile(path_, bytes);
  auto a = Artifact::Load(path_);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(a.status(), "does not match its checksum")) << a.status();
}

TEST_F(ArtifactTest, UnknownVersionAndForeignFiles) {
  std::string bytes = testing::ReadFile(path_);
  const std::string key = "\"scd.format_version\":\"2\"";
  size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  bytes[at + key.size() - 2] = '9';
  testing::WriteFile(path_, bytes);
  auto v9 = Artifact::Load(path_);
  EXPECT_EQ(v9.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(v9.status(), "format version 9 is not supported")) << v9.status();
  // A model checkpoint is a safetensors file but no artifact.
  auto model_file = Artifact::Load(testing::ModelDir("stories260k") + "/model.safetensors");
  EXPECT_TRUE(Contains(model_file.status(), "not an SCD artifact")) << model_file.status();
  EXPECT_EQ(Artifact::Load(dir_.File("missing.scd")).status().code(), absl::StatusCode::kNotFound);
}

// Format version 1 kept the recompute plan inside the policy document; such files still load.
TEST_F(ArtifactTest, VersionOneFilesStillLoad) {
  artifact_.policy_json = R"({"recompute_layers": [1, 4]})";
  ASSERT_TRUE(artifact_.Save(path_).ok());
  std::string bytes = testing::ReadFile(path_);
  const std::string version = "\"scd.format_version\":\"2\"";
  const std::string typed = "\"scd.recompute_layers\"";
  ASSERT_NE(bytes.find(version), std::string::npos);
  ASSERT_NE(bytes.find(typed), std::string::npos);
  bytes[bytes.find(version) + version.size() - 2] = '1';
  bytes[bytes.find(typed) + typed.size() - 2] = 'X';  // a key version 1 did not have
  testing::WriteFile(path_, bytes);
  auto v1 = Artifact::Load(path_);
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->recompute_layers, (std::vector<int>{1, 4}));
  EXPECT_EQ(v1->PatchLayers(), (std::vector<int>{1, 3}));
}

// Folded maps (per-head ranks) round trip at format version 3; artifacts without stay at 2.
TEST_F(ArtifactTest, FoldedMapsRoundTripAtVersionThree) {
  EXPECT_NE(testing::ReadFile(path_).find("\"scd.format_version\":\"2\""), std::string::npos);
  const std::vector<int> order = {3, 0, 1, 2, 0, 1, 2, 3};  // 4 heads of rank 2
  for (int l : {0, 2, 4}) {
    artifact_.layers[l].key =
        testing::Ok(ReuseTranslator::FoldHeads(artifact_.layers[l].key, order));
  }
  ASSERT_TRUE(artifact_.Save(path_).ok());
  EXPECT_NE(testing::ReadFile(path_).find("\"scd.format_version\":\"3\""), std::string::npos);
  const Artifact loaded = testing::Ok(Artifact::LoadFor(path_, *model_, *model_));
  at::Tensor x = at::randn({4, 9, 8});
  for (int l : {0, 2, 4}) {
    const ReuseTranslator& k = loaded.layers[l].key;
    ASSERT_TRUE(k.folded()) << l;
    EXPECT_EQ(k.column_heads(), order);
    EXPECT_FALSE(loaded.layers[l].value.folded());
    EXPECT_TRUE(at::equal(k.Encode(x, 5), artifact_.layers[l].key.Encode(x, 5)));
  }
  EXPECT_EQ(loaded.FrontierLimits().max_k, (std::vector<int64_t>{8, 0, 8, 0, 8}));
}

TEST_F(ArtifactTest, BadRecomputeLayersAreRefused) {
  artifact_.recompute_layers = {2, 99};
  ASSERT_TRUE(artifact_.Save(path_).ok());
  auto bad = Artifact::Load(path_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(bad.status(), "recompute layer 99")) << bad.status();
}

}  // namespace
}  // namespace scd
