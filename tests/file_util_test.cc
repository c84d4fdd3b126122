// base/file_util.h: whole files round-trip byte for byte; failures are statuses naming the path.
#include "base/file_util.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/test_files.h"

namespace scd {
namespace {

TEST(FileUtilTest, RoundTripsBinaryBytes) {
  testing::TempDir dir;
  std::string bytes;
  for (int i = 0; i < 200000; ++i) bytes.push_back(static_cast<char>(i * 31 % 256));  // NULs too
  ASSERT_TRUE(WriteStringToFile(dir.File("x.bin"), bytes).ok());
  absl::StatusOr<std::string> back = ReadFileToString(dir.File("x.bin"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  ASSERT_TRUE(WriteStringToFile(dir.File("x.bin"), "short").ok());  // truncates
  EXPECT_EQ(testing::Ok(ReadFileToString(dir.File("x.bin"))), "short");
  ASSERT_TRUE(WriteStringToFile(dir.File("empty"), "").ok());
  EXPECT_EQ(testing::Ok(ReadFileToString(dir.File("empty"))), "");
}

TEST(FileUtilTest, MissingFileAndDirectoryAreNotFound) {
  testing::TempDir dir;
  absl::StatusOr<std::string> missing = ReadFileToString(dir.File("nope.txt"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);
  absl::StatusOr<std::string> directory = ReadFileToString(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(directory.status().message().find("directory"), std::string::npos);
}

TEST(FileUtilTest, UnwritablePathIsAnError) {
  testing::TempDir dir;
  absl::Status s = WriteStringToFile(dir.File("no/such/dir/out.txt"), "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out.txt"), std::string::npos);
}

TEST(FileUtilTest, CreatesDirectoriesWithTheirParentsOrSaysWhyNot) {
  testing::TempDir dir;
  const std::string nested = dir.File("a/b/c");
  ASSERT_TRUE(CreateDirectories(nested).ok());
  ASSERT_TRUE(CreateDirectories(nested).ok());  // there already: fine
  ASSERT_TRUE(WriteStringToFile(nested + "/x.txt", "x").ok());
  // A file in the way, at the leaf or above it.
  for (const std::string& blocked : {nested + "/x.txt", nested + "/x.txt/d"}) {
    absl::Status s = CreateDirectories(blocked);
    ASSERT_FALSE(s.ok()) << blocked;
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(s.message().find(blocked), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace scd
