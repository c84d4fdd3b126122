// scd-calib: offline calibration and fidelity evaluation of producer -> consumer pairs.
//   scd-calib fit  --producer DIR --consumer DIR --out FILE [options]
//   scd-calib eval --producer DIR --consumer DIR --artifact FILE [options]
//   scd-calib generate --producer DIR --consumer DIR --artifact FILE --prompt TEXT [--mode scd]
// Tables go to stdout, progress and logs to stderr; errors are one line and exit status 1.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/svg_plot.h"
#include "calib/calibrator.h"
#include "calib/continuation.h"
#include "calib/evaluation.h"
#include "calib/model_pair.h"
#include "calib/report_json.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "model/generator.h"
#include "model/runtime.h"
#include "tools/tool_common.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct Common {
  CommonToolFlags tool;
  std::string producer, consumer;
};

absl::StatusOr<ModelPair> LoadModels(const Common& common) {
  spdlog::info("threads: {}", ConfigureThreads(common.tool.threads).ToString());
  return ModelPair::Load(common.producer, common.consumer);
}

absl::StatusOr<std::vector<int>> ParseLayerList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", std::string(piece), "' is not a layer index"));
    }
    out.push_back(v);
  }
  return out;
}

struct FitFlags {
  std::string out, data, fit = "rrr", h_basis = "rrr", patch_budget = "auto", aligner_loss = "kv";
  int prefixes = 200, tokens = 128, k_min = 1, k_max = 0, heldout = 24, recompute = 0;
  int64_t rank_k = 0, rank_v = 0, rank_h = 0, reservoir = 32768;
  double energy = 0.99, ridge = 1e-4;
  bool shared_map = false, no_vocab_sweep = false;
  int aligner_width = 512, aligner_depth = 2, aligner_epochs = 60, aligner_batch = 512;
  double aligner_lr = 3e-3, aligner_seconds = 60;
  uint64_t seed = 0;
};

absl::Status RunFit(const Common& common, const FitFlags& f) {
  SCD_ASSIGN_OR_RETURN(ModelPair m, LoadModels(common));
  CalibrationOptions o;
  o.data_path =
      f.data.empty() ? common.tool.SharedDir() + "/data/tinystories_train_head.txt" : f.data;
  o.prefixes = f.prefixes;
  o.tokens = f.tokens;
  o.heldout_windows = f.heldout;
  SCD_ASSIGN_OR_RETURN(o.fit_method, ParseFitMethod(f.fit));
  SCD_ASSIGN_OR_RETURN(o.hidden_basis, ParseFitMethod(f.h_basis));
  o.rank_k = f.rank_k;
  o.rank_v = f.rank_v;
  o.rank_h = f.rank_h;
  o.energy = f.energy;
  o.ridge = f.ridge;
  o.per_head = !f.shared_map;
  o.vocab_sweep = !f.no_vocab_sweep;
  const int layers = static_cast<int>(m.consumer->config().num_layers);
  if (f.patch_budget != "auto") {
    int k = 0;
    if (!absl::SimpleAtoi(f.patch_budget, &k) || k < 0 || k > layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--patch-budget must be 'auto' or 0..", layers));
    }
    o.policy.fixed_k = k;
    if (k == 0) o.policy.fixed_k = -1;  // no patch layers
  }
  o.policy.k_min = f.k_min;
  o.policy.k_max = f.k_max > 0 ? f.k_max : std::max(1, layers / 2);
  o.recompute_layers = f.recompute;
  o.aligner.shape = {f.aligner_width, f.aligner_depth};
  o.aligner.loss = f.aligner_loss == "hidden" ? AlignerTrainOptions::Loss::kHidden
                                              : AlignerTrainOptions::Loss::kKeyValue;
  if (f.aligner_loss != "kv" && f.aligner_loss != "hidden") {
    return absl::InvalidArgumentError("--aligner-loss must be kv or hidden");
  }
  o.aligner.max_epochs = f.aligner_epochs;
  o.aligner.batch = f.aligner_batch;
  o.aligner.lr = f.aligner_lr;
  o.aligner.max_seconds = f.aligner_seconds;
  o.reservoir_rows = f.reservoir;
  o.seed = f.seed;
  o.progress = !common.tool.quiet;
  SCD_ASSIGN_OR_RETURN(CalibrationResult result,
                       Calibrate(*m.producer, *m.consumer, *m.tokenizer, o));
  SCD_RETURN_IF_ERROR(result.artifact.Save(f.out));
  std::fputs(FormatFitSummary(f.out, result).c_str(), stdout);
  return absl::OkStatus();
}

struct EvalFlags {
  std::string artifact, data, modes = "local,raw,int4,recompute,reuse,scd", json, out_dir = ".",
                              code_dtype = "f16", raw_dtype = "f16", recompute_layers;
  int windows = 64, prefix = 64, continuation = 32, greedy = 32;
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;
  bool depth_errors = false, rank_sweep = false;
};

absl::Status RunEval(const Common& common, const EvalFlags& f) {
  SCD_ASSIGN_OR_RETURN(ModelPair m, LoadModels(common));
  SCD_ASSIGN_OR_RETURN(Artifact artifact, Artifact::LoadFor(f.artifact, *m.producer, *m.consumer));
  SCD_ASSIGN_OR_RETURN(std::vector<TransferMode> modes, ParseTransferModes(f.modes));
  TransferOptions transfer;
  SCD_ASSIGN_OR_RETURN(transfer.code_dtype, ParseWireDtype(f.code_dtype));
  SCD_ASSIGN_OR_RETURN(transfer.raw_dtype, ParseWireDtype(f.raw_dtype));
  transfer.rank_k = f.rank_k;
  transfer.rank_v = f.rank_v;
  transfer.rank_h = f.rank_h;
  SCD_ASSIGN_OR_RETURN(transfer.recompute_layers, ParseLayerList(f.recompute_layers));
  const std::string data =
      f.data.empty() ? common.tool.SharedDir() + "/data/tinystories_valid_hf.txt" : f.data;
  FidelityOptions fo{f.prefix, f.continuation, f.greedy};
  SCD_ASSIGN_OR_RETURN(Evaluation eval, Evaluation::Create(*m.producer, *m.consumer, &artifact,
                                                           *m.tokenizer, data, f.windows, fo));
  std::vector<ModeResult> results;
  for (TransferMode mode : modes) {
    if (!common.tool.quiet)
      std::fprintf(stderr, "evaluating %s ...\n", TransferModeName(mode).c_str());
    SCD_ASSIGN_OR_RETURN(ModeResult r, eval.Run(mode, transfer, /*greedy=*/f.greedy > 0));
    results.push_back(r);
  }
  std::string table =
      absl::StrFormat("%s -> %s, artifact %s, data %s\n", artifact.producer.name,
                      artifact.consumer.name, f.artifact, fs::path(data).filename().string());
  table += FormatModeTable(results);
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
  Json context = {{"producer", artifact.producer.name},
                  {"consumer", artifact.consumer.name},
                  {"artifact", f.artifact},
                  {"data", data},
                  {"windows", f.windows},
                  {"prefix", f.prefix},
                  {"continuation", f.continuation},
                  {"patch_layers", artifact.PatchLayers()}};
  if (!f.json.empty()) {
    const std::string json = ModeResultsJson(results, context).dump(2);
    if (f.json == "-") {
      std::fputs((json + "\n").c_str(), stdout);
    } else {
      SCD_RETURN_IF_ERROR(WriteStringToFile(f.json, json + "\n"));
    }
  }
  if (f.depth_errors) {
    if (!common.tool.quiet) std::fprintf(stderr, "depth errors ...\n");
    SCD_ASSIGN_OR_RETURN(std::vector<double> reuse,
                         eval.DepthErrors(TransferMode::kReuse, transfer));
    SCD_ASSIGN_OR_RETURN(std::vector<double> scd, eval.DepthErrors(TransferMode::kScd, transfer));
    std::string csv = "layer,reuse_rel_error,scd_rel_error,route\n";
    std::vector<double> xs;
    for (size_t l = 0; l < reuse.size(); ++l) {
      absl::StrAppendFormat(&csv, "%d,%.6g,%.6g,%s\n", l, reuse[l], scd[l],
                            LayerRouteName(artifact.layers[l].route));
      xs.push_back(static_cast<double>(l));
    }
    const std::string base = (fs::path(f.out_dir) / "depth_errors").string();
    SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
    SvgPlot plot(absl::StrCat("Attention-input error by depth: ", artifact.producer.name, " -> ",
                              artifact.consumer.name),
                 "layer", "relative l2 error of H");
    plot.AddLine("reuse", xs, reuse);
    plot.AddLine("scd", xs, scd);
    for (int l : artifact.PatchLayers()) plot.AddVerticalMarker(l, "patch");
    SCD_RETURN_IF_ERROR(plot.WriteFile(base + ".svg"));
    std::fprintf(stdout, "\ndepth errors (relative l2 of each layer's attention input):\n%s",
                 csv.c_str());
    std::fprintf(stdout, "wrote %s.csv and %s.svg\n", base.c_str(), base.c_str());
  }
  if (f.rank_sweep) {
    if (!common.tool.quiet) std::fprintf(stderr, "rank sweep ...\n");
    const TransferMode mode =
        artifact.PatchLayers().empty() ? TransferMode::kReuse : TransferMode::kScd;
    SCD_ASSIGN_OR_RETURN(std::vector<RankSweepPoint> points, eval.RankSweep(mode, transfer));
    std::string csv =
        "mode,rank_k,rank_v,rank_h,bytes_per_token,payload_ratio,kl,ppl_ratio,pareto\n";
    std::vector<double> all_x, all_y, front_x, front_y;
    for (const RankSweepPoint& p : points) {
      absl::StrAppendFormat(&csv, "%s,%d,%d,%d,%.2f,%.5f,%.6g,%.5f,%d\n", TransferModeName(mode),
                            p.rank_k, p.rank_v, p.rank_h, p.metrics.bytes_per_token,
                            p.payload_ratio, p.metrics.kl, p.metrics.ppl_ratio(), p.pareto ? 1 : 0);
      all_x.push_back(100 * p.payload_ratio);
      all_y.push_back(p.metrics.kl);
    }
    std::vector<const RankSweepPoint*> front;
    for (const RankSweepPoint& p : points)
      if (p.pareto) front.push_back(&p);
    std::sort(front.begin(), front.end(),
              [](auto* a, auto* b) { return a->payload_ratio < b->payload_ratio; });
    for (const RankSweepPoint* p : front) {
      front_x.push_back(100 * p->payload_ratio);
      front_y.push_back(p->metrics.kl);
    }
    const std::string base = (fs::path(f.out_dir) / "rank_sweep").string();
    SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
    SvgPlot plot(absl::StrCat("KL vs payload (", TransferModeName(mode), ", nested ranks): ",
                              artifact.producer.name, " -> ", artifact.consumer.name),
                 "payload, % of raw f16 KV", "KL(oracle || mode)");
    plot.SetLogY(true);
    plot.AddPoints("(r_K, r_V) grid", all_x, all_y);
    plot.AddLine("Pareto front", front_x, front_y);
    SCD_RETURN_IF_ERROR(plot.WriteFile(base + ".svg"));
    std::fprintf(stdout, "\nrank sweep:\n%swrote %s.csv and %s.svg\n", csv.c_str(), base.c_str(),
                 base.c_str());
  }
  return absl::OkStatus();
}

struct GenerateFlags {
  std::string artifact, prompt, mode = "scd", code_dtype = "f16";
  int max_tokens = 64;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
};

// The consumer continues a prompt twice: from its own prefill, and from a cache rebuilt out of
// what the producer sent in `mode`. Greedy by default, so the two are directly comparable.
absl::Status RunGenerate(const Common& common, const GenerateFlags& f) {
  SCD_ASSIGN_OR_RETURN(ModelPair m, LoadModels(common));
  ContinuationOptions options;
  options.prompt = f.prompt;
  SCD_ASSIGN_OR_RETURN(options.modes, ParseTransferModes(f.mode));
  std::optional<Artifact> artifact;
  if (!f.artifact.empty()) {
    SCD_ASSIGN_OR_RETURN(artifact, Artifact::LoadFor(f.artifact, *m.producer, *m.consumer));
  }
  SCD_ASSIGN_OR_RETURN(options.transfer.code_dtype, ParseWireDtype(f.code_dtype));
  options.generation.max_tokens = f.max_tokens;
  options.generation.sampling = {f.temperature, 0, f.top_p, f.seed};
  options.hand_off = WireHandOff();  // the checked wire form, as a transport delivers it
  SCD_ASSIGN_OR_RETURN(ContinuationReport report,
                       CompareContinuations(m, artifact ? &*artifact : nullptr, options));
  std::fputs(
      FormatContinuations(report, fs::path(common.consumer).filename().string(), f.prompt).c_str(),
      stdout);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"scd-calib: fit and evaluate SCD translators for a producer -> consumer pair"};
  app.require_subcommand(1);
  Common common;
  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("--producer", common.producer, "producer model directory")->required();
    cmd->add_option("--consumer", common.consumer, "consumer model directory")->required();
    AddCommonFlags(cmd, &common.tool);
  };
  FitFlags fit;
  CLI::App* fit_cmd = app.add_subcommand("fit", "calibrate a pair and write its artifact");
  add_common(fit_cmd);
  fit_cmd->add_option("--out", fit.out, "artifact file to write")->required();
  fit_cmd->add_option("--data", fit.data,
                      "calibration text (default ../shared/data/tinystories_train_head.txt)");
  fit_cmd->add_option("--prefixes", fit.prefixes, "calibration prefixes")->capture_default_str();
  fit_cmd->add_option("--tokens", fit.tokens, "tokens per prefix")->capture_default_str();
  fit_cmd->add_option("--rank-k", fit.rank_k, "key code rank (0: by --energy)");
  fit_cmd->add_option("--rank-v", fit.rank_v, "value code rank (0: by --energy)");
  fit_cmd->add_option("--rank-h", fit.rank_h, "hidden-state code rank (0: by --energy)");
  fit_cmd->add_option("--energy", fit.energy, "spectrum share kept when a rank is 0")
      ->capture_default_str();
  fit_cmd->add_option("--fit", fit.fit, "rrr | joint-svd")->capture_default_str();
  fit_cmd->add_option("--h-basis", fit.h_basis, "hidden-state basis: rrr | pca")
      ->capture_default_str();
  fit_cmd->add_option("--ridge", fit.ridge, "ridge, relative to the mean input variance")
      ->capture_default_str();
  fit_cmd->add_flag("--shared-map", fit.shared_map,
                    "one translator shared by a layer's kv heads (default: one per head)");
  fit_cmd->add_option("--patch-budget", fit.patch_budget, "auto | number of patch layers")
      ->capture_default_str();
  fit_cmd->add_option("--k-min", fit.k_min, "auto budget: fewest patch layers")
      ->capture_default_str();
  fit_cmd->add_option("--k-max", fit.k_max,
                      "auto budget: most patch layers (default half the layers)");
  fit_cmd->add_option("--heldout-windows", fit.heldout, "held-out windows scoring layer choices")
      ->capture_default_str();
  fit_cmd->add_option("--recompute-layers", fit.recompute,
                      "recompute baseline's budget (default: patch budget)");
  fit_cmd->add_option("--aligner-width", fit.aligner_width, "aligner MLP width")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-depth", fit.aligner_depth, "aligner MLP hidden layers")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-epochs", fit.aligner_epochs, "aligner epochs at most")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-batch", fit.aligner_batch, "aligner minibatch")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-lr", fit.aligner_lr, "aligner peak learning rate")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-seconds", fit.aligner_seconds, "time budget per aligner")
      ->capture_default_str();
  fit_cmd->add_option("--aligner-loss", fit.aligner_loss, "kv (regenerated K/V error) | hidden")
      ->capture_default_str();
  fit_cmd->add_option("--reservoir", fit.reservoir, "aligner training rows kept per layer")
      ->capture_default_str();
  fit_cmd->add_flag("--no-vocab-sweep", fit.no_vocab_sweep,
                    "calibrate on the text only (no sequences covering the whole vocabulary)");
  fit_cmd->add_option("--seed", fit.seed, "seed")->capture_default_str();

  EvalFlags ev;
  CLI::App* eval_cmd =
      app.add_subcommand("eval", "fidelity of every transfer mode against the oracle");
  add_common(eval_cmd);
  eval_cmd->add_option("--artifact", ev.artifact, "artifact from scd-calib fit")->required();
  eval_cmd->add_option("--data", ev.data,
                       "evaluation text (default ../shared/data/tinystories_valid_hf.txt)");
  eval_cmd->add_option("--windows", ev.windows, "evaluation windows")->capture_default_str();
  eval_cmd->add_option("--prefix", ev.prefix, "prefix tokens transferred")->capture_default_str();
  eval_cmd->add_option("--continuation", ev.continuation, "teacher-forced tokens scored")
      ->capture_default_str();
  eval_cmd->add_option("--greedy-tokens", ev.greedy, "greedy tokens compared (0: skip)")
      ->capture_default_str();
  eval_cmd->add_option("--modes", ev.modes, "comma-separated transfer modes")
      ->capture_default_str();
  eval_cmd->add_option("--rank-k", ev.rank_k, "truncate key codes to this rank");
  eval_cmd->add_option("--rank-v", ev.rank_v, "truncate value codes to this rank");
  eval_cmd->add_option("--rank-h", ev.rank_h, "truncate hidden-state codes to this rank");
  eval_cmd->add_option("--code-dtype", ev.code_dtype, "f16 | bf16 | f32 | int8")
      ->capture_default_str();
  eval_cmd->add_option("--raw-dtype", ev.raw_dtype, "raw K/V: f16 | bf16 | f32")
      ->capture_default_str();
  eval_cmd->add_option("--recompute-layers", ev.recompute_layers,
                       "e.g. 1,2 (default: the artifact's plan)");
  eval_cmd->add_option("--json", ev.json, "write results as JSON to this file ('-' = stdout)");
  eval_cmd->add_flag("--depth-errors", ev.depth_errors,
                     "per-layer attention-input errors: CSV + SVG");
  eval_cmd->add_flag("--rank-sweep", ev.rank_sweep, "KL vs bytes over nested ranks: CSV + SVG");
  eval_cmd->add_option("--out-dir", ev.out_dir, "where CSV and SVG files go")
      ->capture_default_str();

  GenerateFlags gf;
  CLI::App* gen_cmd = app.add_subcommand(
      "generate", "continue a prompt with the consumer: own prefill vs a transferred cache");
  add_common(gen_cmd);
  gen_cmd->add_option("--artifact", gf.artifact, "artifact (needed by reuse and scd)");
  gen_cmd->add_option("--prompt", gf.prompt, "prompt text")->required();
  gen_cmd->add_option("--mode", gf.mode, "transfer mode(s), comma-separated")
      ->capture_default_str();
  gen_cmd->add_option("--code-dtype", gf.code_dtype, "f16 | bf16 | f32 | int8")
      ->capture_default_str();
  gen_cmd->add_option("--max-tokens", gf.max_tokens, "tokens to generate")->capture_default_str();
  gen_cmd->add_option("--temperature", gf.temperature, "0 = greedy")->capture_default_str();
  gen_cmd->add_option("--top-p", gf.top_p, "nucleus mass")->capture_default_str();
  gen_cmd->add_option("--seed", gf.seed, "sampling seed")->capture_default_str();

  return RunTool("scd-calib", app, argc, argv, common.tool, [&]() -> absl::Status {
    if (fit_cmd->parsed()) return RunFit(common, fit);
    if (eval_cmd->parsed()) return RunEval(common, ev);
    return RunGenerate(common, gf);
  });
}

}  // namespace
}  // namespace scd

int main(int argc, char** argv) { return scd::Main(argc, argv); }
