// An API any gRPC client can use (issue 18): protoc compiles proto/ with proto/ as the include
// root into Python stubs, the Python example (proto/examples/scd_client.py) streams the same text
// from an all-in-one server as the project's own C++ client, and server reflection lists the
// services and hands out their descriptors (tests/grpc_reflection_check.py: what grpcurl does).
// Needs protoc + grpc_python_plugin and Debian's python3-grpcio / python3-protobuf
// (scripts/setup.sh); runs /usr/bin/python3, whose packages those are.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using ::testing::HasSubstr;
using testing::Bin;
using testing::Daemon;
using testing::RunCommand;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kSource = SCD_SOURCE_DIR;

class PythonClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string base = testing::ModelDir("stories260k");
    // The base model and an identical copy: raw transfer is exact, no artifact needed.
    server_ = new Daemon(dir_->path(), "serve",
                         {Bin("scd"), "serve", "--all-in-one", "--producer-model", base,
                          "--consumer", "copy=" + base, "--listen", "127.0.0.1:0"});
    address_ = new std::string(server_->Address(absl::Seconds(60)));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete address_;
    delete dir_;
  }
  static testing::TempDir* dir_;
  static Daemon* server_;
  static std::string* address_;
};
testing::TempDir* PythonClientTest::dir_ = nullptr;
Daemon* PythonClientTest::server_ = nullptr;
std::string* PythonClientTest::address_ = nullptr;

TEST_F(PythonClientTest, StubsFromProtoRootStreamTheSameTextAsTheCppClient) {
  ASSERT_FALSE(address_->empty());
  const std::string stubs = dir_->File("stubs");
  // Exactly the README's command: proto/ is the include root.
  const testing::CommandResult protoc = RunCommand(
      "mkdir -p " + stubs + " && cd " + kSource + " && protoc -Iproto --python_out=" + stubs +
      " --grpc_out=" + stubs + " --plugin=protoc-gen-grpc=$(command -v grpc_python_plugin)" +
      " proto/scd/v1/*.proto");
  ASSERT_EQ(protoc.exit_code, 0) << protoc.err;

  const std::string prompt = "Once upon a time, a little fox";
  const testing::CommandResult python = RunCommand(
      std::string(kPython) + " " + kSource + "/proto/examples/scd_client.py --stubs " + stubs +
      " --address " + *address_ + " --target copy --mode raw --max-tokens 24 --prompt '" +
      prompt + "'");
  ASSERT_EQ(python.exit_code, 0) << python.err;
  EXPECT_THAT(python.err, HasSubstr("health: serving (coordinator"));
  EXPECT_THAT(python.err, HasSubstr("model: copy (consumer)"));
  EXPECT_THAT(python.err, HasSubstr("[copy] length: mode raw"));
  EXPECT_THAT(python.err, HasSubstr("24 output tokens"));

  // The project's C++ client, same request: the same continuation.
  const testing::CommandResult cpp = RunCommand(
      Bin("scd") + " generate --server " + *address_ +
      " --target copy --mode raw --max-tokens 24 --prompt '" + prompt + "'");
  ASSERT_EQ(cpp.exit_code, 0) << cpp.err;
  ASSERT_FALSE(python.out.empty());
  EXPECT_THAT(cpp.out, HasSubstr(python.out)) << "python: " << python.out;

  // An error reaches the client as a status: an unknown target.
  const testing::CommandResult unknown = RunCommand(
      std::string(kPython) + " " + kSource + "/proto/examples/scd_client.py --stubs " + stubs +
      " --address " + *address_ + " --target nobody");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
}

TEST_F(PythonClientTest, ReflectionListsTheServicesAndTheirDescriptors) {
  ASSERT_FALSE(address_->empty());
  const testing::CommandResult run = RunCommand(std::string(kPython) + " " + kSource +
                                                "/tests/grpc_reflection_check.py " + *address_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("scd.v1.Inference\n"));
  EXPECT_THAT(run.out, HasSubstr("grpc.reflection.v1alpha.ServerReflection\n"));
  EXPECT_THAT(run.out, HasSubstr("scd.v1.Inference.Generate\n"));
  EXPECT_THAT(run.out, HasSubstr("scd.v1.Inference.ListModels\n"));
}

}  // namespace
}  // namespace scd
