// TomlConfig against a real CLI11 app: values from the file reach the flags, flags on the command
// line win, and every malformed file is an error that names the key or the line.
#include "tools/toml_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "test_files.h"

namespace scd {
namespace {

struct DaemonFlags {
  std::string model;
  std::string listen = "127.0.0.1:0";
  double link_gbps = 0;
  int port_base = 0;
  bool verbose = false;
  std::vector<std::string> artifacts;
  std::string serve_name;
};

// A daemon-like command line bound to `flags`, with --config.
void RegisterFlags(CLI::App* app, DaemonFlags* flags) {
  app->add_option("--model", flags->model)->required();
  app->add_option("--listen", flags->listen);
  app->add_option("--link-gbps", flags->link_gbps);
  app->add_option("--port-base", flags->port_base);
  app->add_flag("--verbose", flags->verbose);
  app->add_option("--artifact", flags->artifacts);
  CLI::App* serve = app->add_subcommand("serve");
  serve->add_option("--name", flags->serve_name);
  AddConfigFileFlag(app);
}

class TomlConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterFlags(&app_, &flags_); }

  std::string WriteConfig(const std::string& text) {
    const std::string path = dir_.path() + "/node.toml";
    std::ofstream(path) << text;
    return path;
  }

  // Parses `args` (argv[0] added); returns the CLI11 error message, "" on success.
  std::string Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "scd-test");
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    try {
      app_.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& error) {
      return error.what();
    }
    return "";
  }

  testing::TempDir dir_;
  CLI::App app_{"test"};
  DaemonFlags flags_;
};

TEST_F(TomlConfigTest, KeysSetTheirFlags) {
  const std::string path = WriteConfig(R"(
# a producer node
model = "/models/base"
link-gbps = 12.5
port_base = 7000          # snake_case spells the same flag
verbose = true
artifact = ["a.scd", "b.scd"]
)");
  ASSERT_EQ(Parse({"--config", path}), "");
  EXPECT_EQ(flags_.model, "/models/base");
  EXPECT_EQ(flags_.listen, "127.0.0.1:0");  // untouched default
  EXPECT_DOUBLE_EQ(flags_.link_gbps, 12.5);
  EXPECT_EQ(flags_.port_base, 7000);
  EXPECT_TRUE(flags_.verbose);
  EXPECT_EQ(flags_.artifacts, (std::vector<std::string>{"a.scd", "b.scd"}));
}

TEST_F(TomlConfigTest, CommandLineWinsOverTheFile) {
  const std::string path = WriteConfig("model = \"/from/file\"\nlisten = \"0.0.0.0:9\"\n");
  ASSERT_EQ(Parse({"--config", path, "--listen", "127.0.0.1:5"}), "");
  EXPECT_EQ(flags_.model, "/from/file");
  EXPECT_EQ(flags_.listen, "127.0.0.1:5");
}

TEST_F(TomlConfigTest, SectionsReachSubcommands) {
  const std::string path = WriteConfig("model = \"m\"\n[serve]\nname = \"fables\"\n");
  ASSERT_EQ(Parse({"--config", path, "serve"}), "");
  EXPECT_EQ(flags_.serve_name, "fables");
}

TEST_F(TomlConfigTest, UnknownKeyNamesTheKey) {
  const std::string path = WriteConfig("model = \"m\"\nlink-gpbs = 3\n");
  EXPECT_NE(Parse({"--config", path}).find("'link-gpbs': no such flag"), std::string::npos);
}

TEST_F(TomlConfigTest, UnknownSectionIsAnError) {
  const std::string path = WriteConfig("model = \"m\"\n[producer]\nname = \"x\"\n");
  EXPECT_NE(Parse({"--config", path}).find("[producer]: no such subcommand"), std::string::npos);
}

TEST_F(TomlConfigTest, SyntaxErrorNamesTheLine) {
  const std::string path = WriteConfig("model = \"m\"\nlisten = \n");
  EXPECT_NE(Parse({"--config", path}).find("config line 2"), std::string::npos);
}

TEST_F(TomlConfigTest, WrongValueShapesAreErrors) {
  EXPECT_NE(Parse({"--config", WriteConfig("model = \"m\"\nartifact = [[\"a\"]]\n")})
                .find("'artifact': arrays must hold plain values"),
            std::string::npos);
  EXPECT_NE(Parse({"--config", WriteConfig("model = \"m\"\nlink-gbps = \"fast\"\n")}), "");
}

TEST_F(TomlConfigTest, RequiredFlagMissingFromBothIsAnError) {
  EXPECT_NE(Parse({"--config", WriteConfig("listen = \"x:1\"\n")}).find("--model"),
            std::string::npos);
}

TEST_F(TomlConfigTest, MissingFileIsAnError) {
  EXPECT_NE(Parse({"--config", dir_.path() + "/absent.toml"}), "");
}

TEST_F(TomlConfigTest, WrittenConfigReadsBackToTheSameValues) {
  ASSERT_EQ(
      Parse({"--model", "/m", "--link-gbps", "2.25", "--artifact", "x.scd", "--artifact", "y.scd"}),
      "");
  const std::string written =
      app_.config_to_str(/*default_also=*/false, /*write_description=*/false);
  const std::string path = WriteConfig(written);

  CLI::App second{"second"};
  DaemonFlags reread;
  RegisterFlags(&second, &reread);
  std::vector<std::string> args = {"second", "--config", path};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  ASSERT_NO_THROW(second.parse(static_cast<int>(argv.size()), argv.data())) << written;
  EXPECT_EQ(reread.model, "/m");
  EXPECT_DOUBLE_EQ(reread.link_gbps, 2.25);
  EXPECT_EQ(reread.artifacts, (std::vector<std::string>{"x.scd", "y.scd"}));
}

}  // namespace
}  // namespace scd
