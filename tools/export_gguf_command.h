// `scd export-gguf`: a checkpoint (or seeded dummy weights for a config) as a GGUF file for
// llama.cpp (model/gguf_export.h). Thin: flags -> ExportGguf.
//   scd export-gguf --model DIR --type f32|f16|bf16|q8_0 --out FILE
//   scd export-gguf --dummy-weights CONFIG [--layers N] [--seed S] --type q8_0 --out FILE
// Thread-safety: call from main() only.
#ifndef SCD_TOOLS_EXPORT_GGUF_COMMAND_H_
#define SCD_TOOLS_EXPORT_GGUF_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace scd {

struct ExportGgufFlags {
  std::string model;          // a Hugging Face model directory
  std::string dummy_weights;  // or a config.json: seeded dummy weights, as the runtime draws them
  int64_t layers = 0;         // dummy: keep the first N layers (0: all)
  uint64_t seed = 1;          // dummy: the seed (the runtime's and scd serve's producer default)
  std::string type = "f32";   // f32, f16, bf16, q8_0
  std::string out;
  std::string name;  // general.name ("" = the directory's or config's name)
};

// Registers the subcommand's flags on `command`.
void AddExportGgufFlags(CLI::App* command, ExportGgufFlags* flags);

// Loads the model in float32, writes the file, prints one summary line (tensors, bytes, what a
// Q8_0 file keeps in F32, the vocabulary's kind) to stdout.
absl::Status RunExportGguf(const ExportGgufFlags& flags);

}  // namespace scd

#endif  // SCD_TOOLS_EXPORT_GGUF_COMMAND_H_
