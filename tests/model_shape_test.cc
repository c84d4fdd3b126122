// ReadModelShape against a real config: tinystories-4m (6 layers, 2 KV heads of 256 / 4 = 64
// dimensions, float32: 2 x 6 x 2 x 64 x 4 = 6,144 bytes a token; its profile's kv_bytes_per_token),
// and the errors for a missing or broken config.json.
#include "bench/model_shape.h"

#include <gtest/gtest.h>

#include "tests/test_files.h"

namespace scd::bench {
namespace {

TEST(ModelShapeTest, ARealConfigsVocabularyPositionsAndKvBytes) {
  const absl::StatusOr<ModelShape> shape = ReadModelShape(testing::ModelDir("tinystories-4m"));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->vocab_size, 512);
  EXPECT_EQ(shape->max_position_embeddings, 512);
  EXPECT_EQ(shape->kv_bytes_per_token, 2 * 6 * 2 * 64 * 4);
}

TEST(ModelShapeTest, AMissingOrBrokenConfigIsRefused) {
  testing::TempDir dir;
  EXPECT_EQ(ReadModelShape(dir.path() + "/none").status().code(), absl::StatusCode::kNotFound);
  testing::WriteFile(dir.path() + "/config.json", "[1, 2]");
  EXPECT_EQ(ReadModelShape(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  testing::WriteFile(dir.path() + "/config.json", R"({"vocab_size": 512, "hidden_size": 64})");
  const absl::Status no_layers = ReadModelShape(dir.path()).status();
  EXPECT_EQ(no_layers.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_layers.message().find("config.json"), std::string::npos) << no_layers;
}

}  // namespace
}  // namespace scd::bench
