#include "tools/toml_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <memory>
#include <sstream>

namespace scd {
namespace {

// TOML's convention is snake_case; our flags are kebab-case. Both spell the same key.
std::string FlagName(std::string_view key) {
  std::string name(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string FullName(const std::vector<std::string>& parents, const std::string& name) {
  std::string full;
  for (const std::string& parent : parents) full += parent + ".";
  return full + name;
}

// One scalar as the text CLI11 would have received on the command line.
std::string ScalarText(const toml::node& node, const std::string& key) {
  if (const auto* text = node.as_string()) return text->get();
  if (const auto* number = node.as_integer()) return std::to_string(number->get());
  if (const auto* flag = node.as_boolean()) return flag->get() ? "true" : "false";
  if (const auto* real = node.as_floating_point()) {
    std::ostringstream out;
    out.precision(17);
    out << real->get();
    return out.str();
  }
  throw CLI::ConfigError("config key '" + key + "': expected a string, number or boolean");
}

void Flatten(const CLI::App& app, const toml::table& table, std::vector<std::string> parents,
             std::vector<CLI::ConfigItem>* items) {
  for (const auto& [key, node] : table) {
    const std::string name = FlagName(key.str());
    const std::string full = FullName(parents, name);
    if (const auto* section = node.as_table()) {
      const CLI::App* command = nullptr;
      try {
        command = app.get_subcommand(std::string(key.str()));
      } catch (const CLI::OptionNotFound&) {
        throw CLI::ConfigError("config section [" + full + "]: no such subcommand");
      }
      std::vector<std::string> inner = parents;
      inner.push_back(std::string(key.str()));
      // "++" / "--" open and close a subcommand's section, as CLI11's own TOML reader does.
      items->push_back(CLI::ConfigItem{inner, "++", {}});
      Flatten(*command, *section, inner, items);
      items->push_back(CLI::ConfigItem{inner, "--", {}});
      continue;
    }
    const CLI::Option* option = app.get_option_no_throw("--" + name);
    if (option == nullptr || !option->get_configurable()) {
      throw CLI::ConfigError("config key '" + full + "': no such flag --" + name);
    }
    CLI::ConfigItem item{parents, name, {}};
    if (const auto* array = node.as_array()) {
      for (const toml::node& element : *array) {
        if (element.is_array() || element.is_table()) {
          throw CLI::ConfigError("config key '" + full + "': arrays must hold plain values");
        }
        item.inputs.push_back(ScalarText(element, full));
      }
    } else {
      item.inputs.push_back(ScalarText(node, full));
    }
    items->push_back(std::move(item));
  }
}

}  // namespace

std::vector<CLI::ConfigItem> TomlConfig::from_config(std::istream& input) const {
  std::ostringstream text;
  text << input.rdbuf();
  toml::table table;
  try {
    table = toml::parse(text.str());
  } catch (const toml::parse_error& error) {
    const toml::source_position where = error.source().begin;
    throw CLI::ConfigError("config line " + std::to_string(where.line) + ", column " +
                           std::to_string(where.column) + ": " + std::string(error.description()));
  }
  std::vector<CLI::ConfigItem> items;
  Flatten(*app_, table, {}, &items);
  return items;
}

std::string TomlConfig::to_config(const CLI::App* app, bool default_also, bool write_description,
                                  std::string prefix) const {
  // CLI11's writer already emits TOML our reader accepts.
  return CLI::ConfigTOML().to_config(app, default_also, write_description, std::move(prefix));
}

void AddConfigFileFlag(CLI::App* app) {
  app->config_formatter(std::make_shared<TomlConfig>(app));
  app->set_config("--config", "", "TOML file with any of these flags as keys (flags win)")
      ->check(CLI::ExistingFile);  // a directory or a missing file: said so, by name
  app->allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace scd
