// libFuzzer target: a daemon's --config TOML file (tools/toml_config.h) read against flags of every
// kind the daemons have (strings, numbers, a repeatable flag, a boolean flag, a subcommand).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "tools/toml_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CLI::App app{"fuzz"};
  std::string model, listen;
  double gbps = 0;
  uint32_t capacity = 4;
  bool strict = false;
  std::vector<std::string> artifacts;
  app.add_option("--model", model);
  app.add_option("--listen", listen);
  app.add_option("--link-gbps", gbps)->check(CLI::Number)->check(CLI::Range(0.0, 1.0e6));
  app.add_option("--capacity", capacity)->check(CLI::Range(1, 4096));
  app.add_option("--artifact", artifacts);
  app.add_flag("--strict-modes", strict);
  CLI::App* serve = app.add_subcommand("serve");
  serve->add_option("--listen", listen);
  scd::TomlConfig config(&app);
  std::istringstream input(std::string(reinterpret_cast<const char*>(data), size));
  try {
    (void)config.from_config(input);
  } catch (const CLI::ConfigError&) {
  }
  return 0;
}
