// `--config FILE.toml` for every daemon: a CLI11 config reader backed by toml++ (Debian's
// libtomlplusplus), so a node's settings can live in a file and flags override them.
//
// Keys are the long flag names without the dashes (`model = "..."`, `link-gbps = 10`; `link_gbps`
// is the same key); an array gives a repeatable flag several values (`artifact = ["a", "b"]`);
// a table names a subcommand (`[serve]`). Unknown keys, syntax errors and values of the wrong
// shape are errors naming the key or the line, never silently ignored. A flag given on the command
// line wins over the file.
// Thread-safety: used by CLI11 while main() parses; no shared state.
#ifndef SCD_TOOLS_TOML_CONFIG_H_
#define SCD_TOOLS_TOML_CONFIG_H_

#include <CLI/CLI.hpp>
#include <istream>
#include <string>
#include <vector>

namespace scd {

class TomlConfig : public CLI::Config {
 public:
  // `app` (not owned, outlives this reader) is the command whose flags the keys must name.
  explicit TomlConfig(const CLI::App* app) : app_(app) {}

  // Throws CLI::ConfigError (the CLI11 contract) with the line and column of a syntax error, or
  // the key whose value cannot be a flag value (an array of tables, a nested array) or that names
  // no flag of the app.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
  // Writes the app's current option values as TOML.
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;

 private:
  const CLI::App* app_;
};

// Adds `--config FILE.toml` to `app`, read with TomlConfig; keys that match no flag are errors.
void AddConfigFileFlag(CLI::App* app);

}  // namespace scd

#endif  // SCD_TOOLS_TOML_CONFIG_H_
