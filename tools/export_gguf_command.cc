#include "tools/export_gguf_command.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/gguf_export.h"
#include "model/llama_model.h"

namespace scd {

void AddExportGgufFlags(CLI::App* cmd, ExportGgufFlags* flags) {
  auto* model = cmd->add_option("--model", flags->model, "Hugging Face model directory");
  auto* dummy = cmd->add_option("--dummy-weights", flags->dummy_weights,
                                "a config.json: seeded random weights, the runtime's own");
  model->excludes(dummy);
  cmd->add_option("--layers", flags->layers, "dummy weights: keep only the first N layers")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", flags->seed, "dummy weights' seed")->capture_default_str();
  cmd->add_option("--type", flags->type, "tensor type: f32, f16, bf16 or q8_0")
      ->capture_default_str();
  cmd->add_option("--out", flags->out, "the GGUF file to write")->required();
  cmd->add_option("--name", flags->name, "general.name (default: the model's name)");
}

absl::Status RunExportGguf(const ExportGgufFlags& flags) {
  namespace fs = std::filesystem;
  if (flags.model.empty() == flags.dummy_weights.empty()) {
    return absl::InvalidArgumentError("give --model DIR or --dummy-weights CONFIG");
  }
  GgufExportOptions options;
  SCD_ASSIGN_OR_RETURN(options.type, ParseGgmlType(flags.type));
  std::unique_ptr<LlamaModel> model;
  fs::path source;
  if (!flags.model.empty()) {
    if (flags.layers > 0) return absl::InvalidArgumentError("--layers needs --dummy-weights");
    source = fs::path(flags.model).lexically_normal();
    SCD_ASSIGN_OR_RETURN(model, LlamaModel::Load(source.string(), {}));
    options.tokenizer_json = (source / "tokenizer.json").string();
    if (!fs::exists(options.tokenizer_json)) options.tokenizer_json.clear();
  } else {
    source = fs::path(flags.dummy_weights).lexically_normal();
    SCD_ASSIGN_OR_RETURN(model, LlamaModel::DummyFromConfig(source.string(), flags.seed,
                                                            flags.layers, {}));
    options.description =
        absl::StrCat("SCD Serve dummy weights: seed ", flags.seed, ", ",
                     model->config().num_layers, " layers of ", source.filename().string(),
                     " (normal(0, 0.02), unit norms); placeholder vocabulary");
  }
  if (!source.has_filename()) source = source.parent_path();
  options.name = !flags.name.empty() ? flags.name
                 : fs::is_directory(source) ? source.filename().string()
                                            : source.stem().string();
  SCD_ASSIGN_OR_RETURN(GgufExportReport report, ExportGguf(*model, options, flags.out));
  std::printf("%s: %s %s, %lld tensors, %llu bytes; vocabulary: %s%s\n", flags.out.c_str(),
              report.architecture.c_str(), GgmlTypeName(options.type),
              static_cast<long long>(report.tensors),
              static_cast<unsigned long long>(report.bytes), report.vocabulary.c_str(),
              report.kept_f32.empty()
                  ? ""
                  : absl::StrCat("; kept in F32 (rows not a multiple of 32): ",
                                 absl::StrJoin(report.kept_f32, ", "))
                        .c_str());
  return absl::OkStatus();
}

}  // namespace scd
