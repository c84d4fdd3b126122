// base/shared_dir.h: the flag wins, then $SCD_SHARED_DIR, then shared/ beside the checkout.
#include "base/shared_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "tests/test_files.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

TEST(SharedDirTest, FindsSharedBesideTheCheckout) {
  testing::TempDir dir;
  fs::create_directories(dir.File("checkout/build/bin"));
  fs::create_directories(dir.File("shared/models"));
  EXPECT_EQ(FindSharedDirBeside(dir.File("checkout/build/bin")), dir.File("shared"));
  EXPECT_EQ(FindSharedDirBeside(dir.File("checkout")), dir.File("shared"));
  // A shared/ without models/ is not the project's folder.
  testing::TempDir other;
  fs::create_directories(other.File("checkout/build/bin"));
  fs::create_directories(other.File("shared/data"));
  const std::string found = FindSharedDirBeside(other.File("checkout/build/bin"));
  EXPECT_NE(found, other.File("shared"));
}

TEST(SharedDirTest, FlagThenEnvironment) {
  const char* saved = std::getenv("SCD_SHARED_DIR");
  const std::string restore = saved != nullptr ? saved : "";
  ::setenv("SCD_SHARED_DIR", "/from/env", 1);
  EXPECT_EQ(ResolveSharedDir("/from/flag"), "/from/flag");
  EXPECT_EQ(ResolveSharedDir(), "/from/env");
  ::unsetenv("SCD_SHARED_DIR");
  // Without the variable the test binary (build/.../bin) finds the real shared/ beside the
  // checkout, which holds models/.
  EXPECT_TRUE(fs::is_directory(fs::path(ResolveSharedDir()) / "models")) << ResolveSharedDir();
  if (saved != nullptr) ::setenv("SCD_SHARED_DIR", restore.c_str(), 1);
}

}  // namespace
}  // namespace scd
