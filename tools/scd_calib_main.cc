// scd-calib: offline calibration and fidelity evaluation of producer -> consumer pairs.
//   scd-calib fit  --producer DIR --consumer DIR --out FILE [options]
//   scd-calib eval --producer DIR --consumer DIR --artifact FILE [options]
//   scd-calib generate --producer DIR --consumer DIR --artifact FILE --prompt TEXT [--mode scd]
//   scd-calib frontier --producer DIR --consumer DIR --artifact FILE [--out FILE]
//   scd-calib synth --producer CONFIG --consumer CONFIG --out FILE [--layers N --rank-k R ...]
//                   [--frontier]
// A thin shell: flags bind straight to calib/'s options structs, the work is library calls.
// Tables go to stdout, progress and logs to stderr; errors are one line and exit status 1.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "calib/calibrator.h"
#include "calib/continuation.h"
#include "calib/eval_report.h"
#include "calib/evaluation.h"
#include "calib/model_pair.h"
#include "calib/report_json.h"
#include "calib/synthetic_artifact.h"
#include "model/blas_kernel.h"
#include "model/runtime.h"
#include "tools/tool_common.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

struct Common {
  CommonToolFlags tool;
  std::string producer, consumer;
  std::string consumer_dtype = "f32";  // the consumer's weights (model/runtime.h, Precision)

  absl::StatusOr<ModelPair> Load() const {
    spdlog::info("threads: {}", ConfigureThreads(tool.threads).ToString());
    SCD_ASSIGN_OR_RETURN(const Precision precision,
                         ParsePrecision(consumer_dtype, c10::Device(c10::kCPU)));
    LlamaModel::Options consumer_options;
    consumer_options.dtype = precision.dtype;
    consumer_options.weights = precision.weights;
    return ModelPair::Load(producer, consumer, {}, consumer_options);
  }
  std::string Data(const std::string& flag, const char* file) const {
    return flag.empty() ? tool.SharedDir() + "/data/" + file : flag;
  }
};

const std::map<std::string, FitMethod> kFitMethods = {
    {"rrr", FitMethod::kRrr}, {"joint-svd", FitMethod::kJointSvd}, {"pca", FitMethod::kPca}};
const std::map<std::string, WireDtype> kCodeDtypes = {{"f32", WireDtype::kF32},
                                                      {"f16", WireDtype::kF16},
                                                      {"bf16", WireDtype::kBF16},
                                                      {"int8", WireDtype::kInt8},
                                                      {"int4", WireDtype::kInt4}};
constexpr const char* kCodeDtypeHelp =
    "f16 | bf16 | f32 | int8 (one f16 scale per code row) | int4 (groups of 32 values of the "
    "flattened code, f16 scale and zero each)";
// The frontier fit's flags, shared by fit and frontier (precisions as names: ParseFrontierDtypes).
void AddFrontierFlags(CLI::App* cmd, FrontierFitOptions* o, std::vector<std::string>* dtypes) {
  cmd->add_option("--frontier-dtypes", *dtypes, "code precisions on the frontier")
      ->delimiter(',')
      ->check(CLI::IsMember({"f16", "int8", "int4"}))
      ->default_str("f16,int8,int4");
  cmd->add_option("--frontier-points", o->points_per_dtype,
                  "points measured along each precision's greedy path")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--frontier-ladder", o->ladder_steps,
                  "rungs of each code's rank ladder (full, 3/4, 1/2, 1/4, ...)")
      ->check(CLI::Range(1, 7))
      ->capture_default_str();
  cmd->add_option("--frontier-recommend", o->recommend_kl_ratio,
                  "recommended point: the cheapest with KL <= this x the full f16 KL")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  cmd->add_flag("--no-frontier-head-ranks{false}", o->head_ranks,
                "one rank per layer for every kv head (default: per-head maps are folded so "
                "that the frontier ranks each head's columns on its own)");
}

absl::Status ParseFrontierDtypes(const std::vector<std::string>& names, FrontierFitOptions* o) {
  if (names.empty()) return absl::OkStatus();  // the default list
  o->dtypes.clear();
  for (const std::string& name : names) {
    SCD_ASSIGN_OR_RETURN(WireDtype dtype, ParseWireDtype(name));
    o->dtypes.push_back(dtype);
  }
  return absl::OkStatus();
}

const std::map<std::string, AlignerTrainOptions::Loss> kAlignerLosses = {
    {"kv", AlignerTrainOptions::Loss::kKeyValue}, {"hidden", AlignerTrainOptions::Loss::kHidden}};

struct FitCommand {
  CalibrationOptions options;
  std::string out, patch_budget = "auto";
  std::vector<std::string> frontier_dtypes;

  void Register(CLI::App* cmd) {
    CalibrationOptions& o = options;
    cmd->add_option("--out", out, "artifact file to write")->required();
    cmd->add_option("--data", o.data_path,
                    "calibration text (default: <shared>/data/tinystories_train_head.txt)");
    cmd->add_option("--prefixes", o.prefixes, "calibration prefixes")->capture_default_str();
    cmd->add_option("--tokens", o.tokens, "tokens per prefix")->capture_default_str();
    cmd->add_option("--rank-k", o.rank_k, "key code rank (0: by --energy)");
    cmd->add_option("--rank-v", o.rank_v, "value code rank (0: by --energy)");
    cmd->add_option("--rank-h", o.rank_h, "hidden-state code rank (0: by --energy)");
    cmd->add_option("--energy", o.energy, "spectrum share kept when a rank is 0")
        ->capture_default_str();
    cmd->add_option("--fit", o.fit_method, "rrr | joint-svd")
        ->transform(CLI::CheckedTransformer(kFitMethods));
    cmd->add_option("--h-basis", o.hidden_basis, "hidden-state basis: rrr | pca")
        ->transform(CLI::CheckedTransformer(kFitMethods));
    cmd->add_option("--ridge", o.ridge, "ridge, relative to the mean input variance")
        ->capture_default_str();
    cmd->add_flag("--shared-map{false}", o.per_head,
                  "one translator shared by a layer's kv heads (default: one per head)");
    cmd->add_option("--patch-budget", patch_budget, "auto | number of patch layers")
        ->capture_default_str();
    cmd->add_option("--k-min", o.policy.k_min, "auto budget: fewest patch layers")
        ->capture_default_str();
    cmd->add_option("--k-max", o.policy.k_max,
                    "auto budget: most patch layers (default half the layers)");
    cmd->add_option("--heldout-windows", o.heldout_windows, "held-out windows scoring layers")
        ->capture_default_str();
    cmd->add_option("--recompute-layers", o.recompute_layers,
                    "recompute baseline's budget (default: patch budget)");
    cmd->add_option("--aligner-width", o.aligner.shape.width, "aligner MLP width")
        ->capture_default_str();
    cmd->add_option("--aligner-depth", o.aligner.shape.depth, "aligner MLP hidden layers")
        ->capture_default_str();
    cmd->add_option("--aligner-epochs", o.aligner.max_epochs, "aligner epochs at most")
        ->capture_default_str();
    cmd->add_option("--aligner-batch", o.aligner.batch, "aligner minibatch")->capture_default_str();
    cmd->add_option("--aligner-lr", o.aligner.lr, "aligner peak learning rate")
        ->capture_default_str();
    cmd->add_option("--aligner-seconds", o.aligner.max_seconds,
                    "time budget per aligner (0: none; a budget makes the fit machine-dependent)")
        ->capture_default_str();
    cmd->add_option("--aligner-nested-min-rank", o.aligner.nested_min_rank,
                    "train aligners for hidden codes truncated down to this rank too (0: off)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--aligner-loss", o.aligner.loss, "kv (regenerated K/V error) | hidden")
        ->transform(CLI::CheckedTransformer(kAlignerLosses));
    cmd->add_option("--reservoir", o.reservoir_rows, "aligner training rows kept per layer")
        ->capture_default_str();
    cmd->add_flag("--no-vocab-sweep{false}", o.vocab_sweep,
                  "calibrate on the text only (no sequences covering the whole vocabulary)");
    cmd->add_option("--seed", o.seed, "seed")->capture_default_str();
    cmd->add_flag("--no-frontier{false}", o.frontier,
                  "skip the quality-against-bytes frontier (an artifact without one)");
    AddFrontierFlags(cmd, &o.frontier_fit, &frontier_dtypes);
  }

  absl::Status Run(const Common& common) {
    SCD_RETURN_IF_ERROR(ParseFrontierDtypes(frontier_dtypes, &options.frontier_fit));
    SCD_ASSIGN_OR_RETURN(ModelPair m, common.Load());
    options.data_path = common.Data(options.data_path, "tinystories_train_head.txt");
    options.progress = !common.tool.quiet;
    const int layers = static_cast<int>(m.consumer->config().num_layers);
    if (patch_budget != "auto") {
      int k = 0;
      if (!absl::SimpleAtoi(patch_budget, &k) || k < 0 || k > layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("--patch-budget must be 'auto' or 0..", layers));
      }
      options.policy.fixed_k = k > 0 ? k : -1;  // -1: no patch layers
    }
    if (options.policy.k_max <= 0) options.policy.k_max = std::max(1, layers / 2);
    SCD_ASSIGN_OR_RETURN(CalibrationResult result,
                         Calibrate(*m.producer, *m.consumer, *m.tokenizer, options));
    SCD_RETURN_IF_ERROR(result.artifact.Save(out));
    std::fputs(FormatFitSummary(out, result).c_str(), stdout);
    return absl::OkStatus();
  }
};

struct EvalCommand {
  std::string artifact, data, modes = "local,raw,int4,recompute,reuse,scd", json, out_dir = ".";
  std::string record;  // a copy of the artifact with scd's fidelity at --consumer-dtype recorded
  int windows = 64;
  FidelityOptions fidelity;
  TransferOptions transfer;
  bool depth_errors = false, rank_sweep = false, frontier = false;

  void Register(CLI::App* cmd) {
    cmd->add_option("--artifact", artifact, "artifact from scd-calib fit")->required();
    cmd->add_option("--data", data,
                    "evaluation text (default: <shared>/data/tinystories_valid_hf.txt)");
    cmd->add_option("--windows", windows, "evaluation windows")->capture_default_str();
    cmd->add_option("--prefix", fidelity.prefix, "prefix tokens transferred")
        ->capture_default_str();
    cmd->add_option("--continuation", fidelity.continuation, "teacher-forced tokens scored")
        ->capture_default_str();
    cmd->add_option("--greedy-tokens", fidelity.greedy_tokens, "greedy tokens compared (0: skip)")
        ->capture_default_str();
    cmd->add_option("--modes", modes, "comma-separated transfer modes")->capture_default_str();
    cmd->add_option("--rank-k", transfer.rank_k, "truncate key codes to this rank");
    cmd->add_option("--rank-v", transfer.rank_v, "truncate value codes to this rank");
    cmd->add_option("--rank-h", transfer.rank_h, "truncate hidden-state codes to this rank");
    cmd->add_option("--code-dtype", transfer.code_dtype, kCodeDtypeHelp)
        ->transform(CLI::CheckedTransformer(kCodeDtypes));
    cmd->add_option("--raw-dtype", transfer.raw_dtype, "raw K/V: f16 | bf16 | f32 | int8 | int4")
        ->transform(CLI::CheckedTransformer(kCodeDtypes));
    cmd->add_option("--recompute-layers", transfer.recompute_layers,
                    "e.g. 1,2 (default: the artifact's plan)")
        ->delimiter(',');
    cmd->add_option("--json", json, "write results as JSON to this file ('-' = stdout)");
    cmd->add_flag("--depth-errors", depth_errors, "per-layer attention-input errors: CSV + PNG");
    cmd->add_flag("--rank-sweep", rank_sweep, "KL vs bytes over nested ranks: CSV + PNG");
    cmd->add_flag("--frontier", frontier,
                  "the artifact's frontier measured here, beside the fixed modes: CSV + PNG");
    cmd->add_option("--out-dir", out_dir, "where CSV and PNG files go")->capture_default_str();
    cmd->add_option("--record", record,
                    "write a copy of the artifact with scd's fidelity at --consumer-dtype recorded "
                    "(consumers serving that precision then accept it)");
  }

  // The artifact with this run's scd measurement at the consumer's precision, saved to --record.
  absl::Status Record(Artifact a, const std::vector<ModeResult>& results, const ModelPair& m) {
    const auto scd = std::find_if(results.begin(), results.end(), [](const ModeResult& r) {
      return r.mode == TransferMode::kScd;
    });
    if (scd == results.end()) return absl::InvalidArgumentError("--record needs scd in --modes");
    a.Record({PrecisionName(m.consumer->precision()), scd->metrics.kl,
              scd->metrics.bytes_per_token, scd->metrics.ppl_ratio(), scd->metrics.windows,
              fs::path(data).filename().string()});
    SCD_RETURN_IF_ERROR(a.Save(record));
    std::printf("recorded scd at %s weights in %s\n", PrecisionName(m.consumer->precision()).c_str(),
                record.c_str());
    return absl::OkStatus();
  }

  absl::Status Run(const Common& common) {
    // Where the results go exists before the evaluation runs (minutes), not after.
    if (depth_errors || rank_sweep || frontier) SCD_RETURN_IF_ERROR(CreateDirectories(out_dir));
    if (!json.empty() && json != "-" && fs::path(json).has_parent_path()) {
      SCD_RETURN_IF_ERROR(CreateDirectories(fs::path(json).parent_path().string()));
    }
    SCD_ASSIGN_OR_RETURN(ModelPair m, common.Load());
    SCD_ASSIGN_OR_RETURN(Artifact a, Artifact::LoadFor(artifact, *m.producer, *m.consumer));
    if (frontier && a.frontier.empty()) {  // before the evaluation, not after it
      return absl::FailedPreconditionError(
          absl::StrCat(artifact, " has no frontier (scd-calib frontier --artifact FILE fits one)"));
    }
    SCD_ASSIGN_OR_RETURN(std::vector<TransferMode> mode_list, ParseTransferModes(modes));
    data = common.Data(data, "tinystories_valid_hf.txt");
    SCD_ASSIGN_OR_RETURN(
        Evaluation eval,
        Evaluation::Create(*m.producer, *m.consumer, &a, *m.tokenizer, data, windows, fidelity));
    std::vector<ModeResult> results;
    for (TransferMode mode : mode_list) {
      if (!common.tool.quiet)
        std::fprintf(stderr, "evaluating %s ...\n", TransferModeName(mode).c_str());
      SCD_ASSIGN_OR_RETURN(ModeResult r, eval.Run(mode, transfer, fidelity.greedy_tokens > 0));
      results.push_back(r);
    }
    std::string out =
        absl::StrFormat("%s -> %s, artifact %s, data %s\n", a.producer.name, a.consumer.name,
                        artifact, fs::path(data).filename().string());
    out += FormatModeTable(results);
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    if (!json.empty()) {
      const nlohmann::json context = {{"producer", a.producer.name},
                                      {"consumer", a.consumer.name},
                                      {"artifact", artifact},
                                      {"data", data},
                                      {"windows", windows},
                                      {"prefix", fidelity.prefix},
                                      {"continuation", fidelity.continuation},
                                      {"patch_layers", a.PatchLayers()}};
      const std::string text = ModeResultsJson(results, context).dump(2) + "\n";
      if (json == "-") {
        std::fputs(text.c_str(), stdout);
      } else {
        SCD_RETURN_IF_ERROR(WriteStringToFile(json, text));
      }
    }
    if (depth_errors) {
      SCD_ASSIGN_OR_RETURN(std::string text, WriteDepthErrors(eval, a, transfer, out_dir));
      std::fputs(text.c_str(), stdout);
    }
    if (rank_sweep) {
      SCD_ASSIGN_OR_RETURN(std::string text, WriteRankSweep(eval, a, transfer, out_dir));
      std::fputs(text.c_str(), stdout);
    }
    if (frontier) {
      SCD_ASSIGN_OR_RETURN(std::string text, WriteFrontierEval(eval, a, out_dir));
      std::fputs(text.c_str(), stdout);
    }
    if (!record.empty()) SCD_RETURN_IF_ERROR(Record(a, results, m));
    return absl::OkStatus();
  }
};

// The consumer continues a prompt from its own prefill and from a cache rebuilt out of what the
// producer sent in each mode, handed over in the checked wire form.
struct GenerateCommand {
  ContinuationOptions options;
  std::string artifact, modes = "scd";

  void Register(CLI::App* cmd) {
    cmd->add_option("--artifact", artifact, "artifact (needed by reuse and scd)");
    cmd->add_option("--prompt", options.prompt, "prompt text")->required();
    cmd->add_option("--mode", modes, "transfer mode(s), comma-separated")->capture_default_str();
    cmd->add_option("--code-dtype", options.transfer.code_dtype, kCodeDtypeHelp)
        ->transform(CLI::CheckedTransformer(kCodeDtypes));
    options.generation.max_tokens = 64;
    cmd->add_option("--max-tokens", options.generation.max_tokens, "tokens to generate")
        ->capture_default_str();
    cmd->add_option("--temperature", options.generation.sampling.temperature, "0 = greedy")
        ->capture_default_str();
    cmd->add_option("--top-p", options.generation.sampling.top_p, "nucleus mass")
        ->capture_default_str();
    cmd->add_option("--seed", options.generation.sampling.seed, "sampling seed")
        ->capture_default_str();
  }

  absl::Status Run(const Common& common) {
    SCD_ASSIGN_OR_RETURN(ModelPair m, common.Load());
    SCD_ASSIGN_OR_RETURN(options.modes, ParseTransferModes(modes));
    std::optional<Artifact> a;
    if (!artifact.empty()) {
      SCD_ASSIGN_OR_RETURN(a, Artifact::LoadFor(artifact, *m.producer, *m.consumer));
    }
    options.hand_off = WireHandOff();
    SCD_ASSIGN_OR_RETURN(ContinuationReport report,
                         CompareContinuations(m, a ? &*a : nullptr, options));
    const std::string name = fs::path(common.consumer).filename().string();
    std::fputs(FormatContinuations(report, name, options.prompt).c_str(), stdout);
    return absl::OkStatus();
  }
};

// frontier: fits (or refits) the frontier of an existing artifact on the held-out split of the
// calibration text, as `fit` would have, and writes the artifact with it.
struct FrontierCommand {
  CalibrationOptions options;
  std::string artifact, out;
  std::vector<std::string> frontier_dtypes;

  void Register(CLI::App* cmd) {
    cmd->add_option("--artifact", artifact, "artifact from scd-calib fit")->required();
    cmd->add_option("--out", out, "artifact file to write (default: --artifact, replaced)");
    cmd->add_option("--data", options.data_path,
                    "calibration text whose last 10 % is the held-out split "
                    "(default: <shared>/data/tinystories_train_head.txt)");
    cmd->add_option("--heldout-windows", options.heldout_windows, "held-out windows")
        ->capture_default_str();
    AddFrontierFlags(cmd, &options.frontier_fit, &frontier_dtypes);
  }

  absl::Status Run(const Common& common) {
    SCD_RETURN_IF_ERROR(ParseFrontierDtypes(frontier_dtypes, &options.frontier_fit));
    if (out.empty()) out = artifact;
    if (fs::path(out).has_parent_path()) {
      SCD_RETURN_IF_ERROR(CreateDirectories(fs::path(out).parent_path().string()));
    }
    SCD_ASSIGN_OR_RETURN(ModelPair m, common.Load());
    SCD_ASSIGN_OR_RETURN(Artifact a, Artifact::LoadFor(artifact, *m.producer, *m.consumer));
    options.data_path = common.Data(options.data_path, "tinystories_train_head.txt");
    SCD_ASSIGN_OR_RETURN(FidelityEvaluator heldout,
                         LoadHeldoutSplit(*m.consumer, *m.tokenizer, options));
    FrontierFitOptions fo = options.frontier_fit;
    fo.progress = !common.tool.quiet;
    FrontierFitTrace trace;
    SCD_RETURN_IF_ERROR(FitFrontierInto(*m.producer, *m.consumer, &a, heldout, fo, &trace));
    a.frontier.heldout = HeldoutSplitName(options);
    // Through a temporary file: `out` may be the artifact just read.
    const std::string tmp = out + ".tmp";
    SCD_RETURN_IF_ERROR(a.Save(tmp));
    std::error_code ec;
    fs::rename(tmp, out, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot replace ", out, ": ", ec.message()));
    std::printf(
        "wrote %s (%s -> %s): frontier of %zu points, %d held-out evaluations, %.1f s; per-head "
        "ranks: %d codes folded, %d evaluations, %.1f s\n%s",
        out.c_str(), a.producer.name.c_str(), a.consumer.name.c_str(), a.frontier.points.size(),
        trace.evaluations, trace.seconds, trace.folded_codes, trace.head_evaluations,
        trace.head_seconds, FormatFrontier(a.frontier).c_str());
    return absl::OkStatus();
  }
};

// synth: an artifact of random orthonormal translators for two (dummy-weight) configs.
struct SynthCommand {
  SyntheticArtifactOptions options;
  std::string producer, consumer, out;
  uint64_t producer_seed = 1, consumer_seed = 2;
  int64_t layers = 0;
  bool frontier = false;

  void Register(CLI::App* cmd) {
    cmd->add_option("--producer", producer, "producer config.json (or a directory holding one)")
        ->required();
    cmd->add_option("--consumer", consumer, "consumer config.json (or a directory holding one)")
        ->required();
    cmd->add_option("--out", out, "artifact file to write")->required();
    cmd->add_option("--layers", layers, "keep only the first N layers of both (0: all)");
    cmd->add_option("--producer-seed", producer_seed, "producer's dummy-weight seed")
        ->capture_default_str();
    cmd->add_option("--consumer-seed", consumer_seed, "consumer's dummy-weight seed")
        ->capture_default_str();
    cmd->add_option("--rank-k", options.key_rank, "key code rank")->capture_default_str();
    cmd->add_option("--rank-v", options.value_rank, "value code rank")->capture_default_str();
    cmd->add_option("--rank-h", options.patch_rank, "hidden-state code rank (patch layers)")
        ->capture_default_str();
    cmd->add_option("--patch-layers", options.patch_layers, "layers sent as hidden-state codes")
        ->delimiter(',');
    cmd->add_option("--recompute-layers", options.recompute_layers,
                    "layers the recompute baseline recomputes")
        ->delimiter(',');
    cmd->add_option("--seed", options.seed, "translator seed")->capture_default_str();
    cmd->add_flag("--frontier", frontier,
                  "add a frontier: every precision at 1, 3/4, 1/2, 1/4, 1/8 of the ranks, bytes "
                  "and costs measured through the codec, KLs made up (timing benches of auto)");
  }

  absl::Status Run(const CommonToolFlags& tool) {
    spdlog::info("threads: {}", ConfigureThreads(tool.threads).ToString());
    SCD_ASSIGN_OR_RETURN(auto p, LlamaModel::DummyFromConfig(producer, producer_seed, layers, {}));
    SCD_ASSIGN_OR_RETURN(auto c, LlamaModel::DummyFromConfig(consumer, consumer_seed, layers, {}));
    SCD_ASSIGN_OR_RETURN(Artifact artifact, SynthesizeArtifact(*p, *c, options));
    if (frontier) {
      SCD_ASSIGN_OR_RETURN(artifact.frontier,
                           SynthesizeFrontier(*p, *c, artifact, SyntheticFrontierOptions()));
      std::printf("%s", FormatFrontier(artifact.frontier).c_str());
    }
    SCD_RETURN_IF_ERROR(artifact.Save(out));
    std::printf("wrote %s: %lld layers, ranks k/v %lld/%lld, %zu patch layers (rank %lld)\n",
                out.c_str(), static_cast<long long>(p->config().num_layers),
                static_cast<long long>(options.key_rank),
                static_cast<long long>(options.value_rank), options.patch_layers.size(),
                static_cast<long long>(options.patch_rank));
    return absl::OkStatus();
  }
};

int Main(int argc, char** argv) {
  SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  CLI::App app{"scd-calib: fit and evaluate SCD translators for a producer -> consumer pair"};
  app.require_subcommand(1);
  Common common;
  auto add = [&](const char* name, const char* help) {
    CLI::App* cmd = app.add_subcommand(name, help);
    cmd->add_option("--producer", common.producer, "producer model directory")->required();
    cmd->add_option("--consumer", common.consumer, "consumer model directory")->required();
    cmd->add_option("--consumer-dtype", common.consumer_dtype,
                    "the consumer's weights: f32, bf16, f16 or int8 (fit and measure at the "
                    "precision it serves with; the artifact records it)")
        ->capture_default_str();
    AddCommonFlags(cmd, &common.tool);
    return cmd;
  };
  FitCommand fit;
  EvalCommand eval;
  GenerateCommand generate;
  CLI::App* fit_cmd = add("fit", "calibrate a pair and write its artifact");
  fit.Register(fit_cmd);
  CLI::App* eval_cmd = add("eval", "fidelity of every transfer mode against the oracle");
  eval.Register(eval_cmd);
  CLI::App* gen_cmd =
      add("generate", "continue a prompt with the consumer: own prefill vs a transferred cache");
  generate.Register(gen_cmd);
  FrontierCommand frontier;
  CLI::App* frontier_cmd =
      add("frontier", "fit the quality-against-bytes frontier of an existing artifact");
  frontier.Register(frontier_cmd);
  SynthCommand synth;
  CLI::App* synth_cmd = app.add_subcommand(
      "synth", "random orthonormal translators for two dummy-weight configs (no calibration)");
  synth.Register(synth_cmd);
  AddCommonFlags(synth_cmd, &common.tool, kThreadsFlag | kLogLevelFlag);
  return RunTool("scd-calib", app, argc, argv, common.tool, [&]() -> absl::Status {
    if (fit_cmd->parsed()) return fit.Run(common);
    if (eval_cmd->parsed()) return eval.Run(common);
    if (synth_cmd->parsed()) return synth.Run(common.tool);
    if (frontier_cmd->parsed()) return frontier.Run(common);
    return generate.Run(common);
  });
}

}  // namespace
}  // namespace scd

int main(int argc, char** argv) { return scd::Main(argc, argv); }
