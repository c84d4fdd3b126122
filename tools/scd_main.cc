// `scd`: the model runtime's command line.
//   scd generate --model DIR --prompt TEXT [sampling flags]   stream a continuation to stdout
//   scd generate --server HOST:PORT --target NAME [--target NAME2] --prompt TEXT [--mode M]
//                [--json] [--stats]                          the same through a serving API
//   scd serve --all-in-one --producer-model DIR --consumer NAME=DIR[:ARTIFACT] ... --listen H:P
//        coordinator, producer and consumers in one process, codes over the in-process transport
//        (--dummy-weights CONFIG / NAME=CONFIG.json [--layers N]: seeded random weights)
//   scd tokenize --model DIR TEXT                             print token ids (and pieces)
//   scd info --model DIR|config.json                          config summary, sizes
//   scd kernels [--others]                                    BLAS kernels: in use, runnable
//   scd export-gguf --model DIR|--dummy-weights CONFIG --type T --out FILE   a GGUF for llama.cpp
// Errors go to stderr as one line and exit with status 1.
#include <ATen/ATen.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/connection_gate.h"
#include "base/status_macros.h"
#include "base/termination_signal.h"
#include "consumer/consumer_node.h"
#include "coordinator/coordinator_node.h"
#include "google/protobuf/util/json_util.h"
#include "model/blas_kernel.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/generator.h"
#include "model/llama_model.h"
#include "model/runtime.h"
#include "producer/producer_node.h"
#include "proto/cluster_secret.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "tokenizer/tokenizer.h"
#include "tools/export_gguf_command.h"
#include "tools/tool_common.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

struct CommonFlags {
  CommonToolFlags tool;
  std::string model;
  std::string device = "cpu";
  std::string dtype = "f32";
};

struct GenerateFlags {
  std::string server;                // client mode: a coordinator's or consumer's Inference API
  std::vector<std::string> targets;  // client mode: consumer model names (several: fan-out)
  std::string mode;                  // client mode: auto (default), scd, raw, local, ...
  bool json = false;                 // client mode: every event as one JSON line
  bool no_local_fallback = false;    // client mode: forbid the consumer's own prefill as fallback
  TlsFiles tls;  // client mode: --tls-ca (and a certificate for mutual TLS)
  std::string prompt;
  std::string prompt_ids;
  GenerationOptions generation;  // sampling, stops and lengths bind straight to it
  bool dummy_weights = false;
  int layers = 0;
  bool stats = false;
};

// --model may name a directory (config.json + weights + tokenizer.json) or, with dummy
// weights, a bare config.json.
std::string ConfigPath(const std::string& model) {
  return fs::is_directory(model) ? (fs::path(model) / "config.json").string() : model;
}

absl::StatusOr<std::vector<TokenId>> ParseIds(const std::string& text) {
  std::vector<TokenId> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(piece, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", std::string(piece), "' is not an integer"));
    }
    ids.push_back(value);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids: no ids given");
  return ids;
}

absl::StatusOr<LlamaModel::Options> RuntimeOptions(const CommonFlags& flags) {
  LlamaModel::Options options;
  SCD_ASSIGN_OR_RETURN(options.device, ParseDevice(flags.device));
  SCD_ASSIGN_OR_RETURN(const Precision precision, ParsePrecision(flags.dtype, options.device));
  options.dtype = precision.dtype;
  options.weights = precision.weights;
  spdlog::info("threads: {}", ConfigureThreads(flags.tool.threads).ToString());
  return options;
}

void WriteOut(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Client mode: the request through a server; text streams for one target (several: each
// target's text at its end), --json prints every event, --stats each target's TTFT breakdown.
absl::Status RunRemoteGenerate(const GenerateFlags& flags) {
  SCD_RETURN_IF_ERROR(ConfigureTls(flags.tls));
  v1::GenerateRequest request;
  request.set_prompt(flags.prompt);
  if (!flags.prompt_ids.empty()) {
    SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids, ParseIds(flags.prompt_ids));
    for (TokenId id : ids) request.add_prompt_ids(id);
  }
  for (const std::string& target : flags.targets) request.add_targets(target);
  SetRequestModeName(flags.mode, &request);
  const GenerationOptions& g = flags.generation;
  request.set_max_tokens(static_cast<uint32_t>(g.max_tokens));
  request.set_temperature(g.sampling.temperature);
  request.set_top_k(static_cast<uint32_t>(g.sampling.top_k));
  request.set_top_p(g.sampling.top_p);
  request.set_seed(g.sampling.seed);
  for (const std::string& stop : g.stop_strings) request.add_stop(stop);
  if (flags.no_local_fallback) request.set_allow_local_fallback(false);  // unset: allowed
  const bool single = flags.targets.size() <= 1;
  std::map<std::string, std::string> texts;
  std::vector<std::string> stats;  // printed after the text
  absl::Status first_error;
  // Several coordinators (comma-separated): a stream whose coordinator goes away resumes
  // through the next.
  const std::vector<std::string> servers = absl::StrSplit(flags.server, ',', absl::SkipEmpty());
  SCD_RETURN_IF_ERROR(StreamGenerateResuming(
      servers, request, absl::Minutes(10), [&](const v1::GenerateEvent& event) {
        if (flags.json) {
          std::string line;
          google::protobuf::util::JsonPrintOptions options;
          options.preserve_proto_field_names = true;
          (void)google::protobuf::util::MessageToJsonString(event, &line, options);
          WriteOut(line + "\n");
          return;
        }
        if (event.has_token()) {
          if (single) WriteOut(event.token().text());
          texts[event.target()] += event.token().text();
        } else if (event.has_error()) {
          if (first_error.ok()) {
            first_error = absl::Status(static_cast<absl::StatusCode>(event.error().code()),
                                       absl::StrCat(event.target(), ": ", event.error().message()));
          }
        } else if (event.has_moved() && flags.stats) {
          const v1::Moved& m = event.moved();
          stats.push_back(
              absl::StrFormat("[%s] %s after %u tokens from %s to %s: %s\n", event.target().c_str(),
                              m.resumed() ? "resumed" : "moved", m.tokens_so_far(),
                              m.resumed() ? "another coordinator" : m.from_node().c_str(),
                              m.to_node().c_str(), m.reason().c_str()));
        } else if (event.has_finished() && flags.stats) {
          const v1::Finished& f = event.finished();
          const v1::Timings& t = f.timings();
          // Layer-wise streaming overlaps prefill, transfer and rebuild: the parts do not add up.
          stats.push_back(absl::StrFormat(
              "[%s] mode %s (%s), %u+%u tokens, %llu payload bytes; ttft %.2f ms (queue %.2f, "
              "prefill %.2f, encode %.2f, transfer %.2f, rebuild %.2f of which %.2f after the "
              "last chunk, first decode %.2f: overlapped); total %.2f ms\n",
              event.target().c_str(), RanModeName(f).c_str(), f.mode_reason().c_str(),
              f.prompt_tokens(), f.output_tokens(),
              static_cast<unsigned long long>(f.payload_bytes()), t.ttft() / 1e3, t.queue() / 1e3,
              t.prefill() / 1e3, t.encode() / 1e3, t.transfer() / 1e3, t.rebuild() / 1e3,
              t.last_rebuild() / 1e3, t.first_decode() / 1e3, t.total() / 1e3));
        }
      }));
  if (!flags.json) {
    if (single) {
      WriteOut("\n");
    } else {
      for (const auto& [target, text] : texts)
        WriteOut(absl::StrCat("[", target, "] ", text, "\n"));
    }
    for (const std::string& line : stats) std::fputs(line.c_str(), stderr);
  }
  return first_error;
}

struct ServeFlags {
  bool all_in_one = false;
  std::string producer_model;
  std::string producer_dummy;          // --dummy-weights CONFIG
  int64_t layers = 0;                  // dummy weights: keep the first N layers
  uint64_t producer_seed = 1;          // dummy weights' seeds (scd-calib synth's defaults)
  uint64_t consumer_seed = 2;
  std::string device = "cpu", dtype = "f32";
  std::vector<std::string> consumers;  // NAME=DIR[:ARTIFACT]
  std::string listen = "127.0.0.1:0";
  std::string address_file;
  std::string control_address_file;
  std::string http_listen;  // "" = no HTTP (OpenAI API, /health, /metrics)
  std::string http_address_file;
  TlsFiles tls;
  PublicApiFlags public_api;
  std::string cluster_secret_file;  // "" = $SCD_CLUSTER_SECRET, else a random one
  consumer::ConsumerNodeOptions consumer;  // batching and admission flags, for every consumer
  size_t prefix_cache_mb = 0;
  double drain_seconds = 30;
  bool strict_modes = false;
  MemoryFlags memory;
};

// The three roles in one process: the coordinator's public API on --listen, every control plane
// on loopback (a random cluster secret unless one is given), codes over the in-process
// transport. SIGTERM/SIGINT drains and exits.
absl::Status RunServe(const ServeFlags& flags, int threads) {
  if (!flags.all_in_one) {
    return absl::InvalidArgumentError(
        "only --all-in-one runs here; separate nodes are scd-coordinator, scd-producer and "
        "scd-consumer");
  }
  if (flags.producer_model.empty() == flags.producer_dummy.empty()) {
    return absl::InvalidArgumentError("give --producer-model DIR or --dummy-weights CONFIG");
  }
  CatchTerminationSignals();  // before any node starts a thread
  spdlog::set_default_logger(spdlog::stderr_color_mt("scd-serve"));  // stdout: nothing
  const std::unique_ptr<MemoryTrimmer> trimmer = ApplyMemoryFlags(flags.memory);  // first thread
  spdlog::info("threads: {}", ConfigureThreads(threads).ToString());
  spdlog::info("open files: up to {}", RaiseOpenFileLimit());
  SCD_RETURN_IF_ERROR(ConfigureTls(flags.tls));
  // HTTP listens at once: /health says "loading" while the models load.
  std::unique_ptr<HttpServer> http;
  if (!flags.http_listen.empty()) {
    SCD_ASSIGN_OR_RETURN(http, HttpServer::Start(HttpOptions(flags.http_listen, flags.tls,
                                                             flags.public_api.max_message_bytes())));
    SCD_RETURN_IF_ERROR(WriteAddressFile(flags.http_address_file, http->address()));
    spdlog::info("HTTP (OpenAI API, /health, /metrics) on {}", http->address());
  }
  std::string secret;
  if (!flags.cluster_secret_file.empty() || std::getenv(kClusterSecretEnv) != nullptr) {
    SCD_ASSIGN_OR_RETURN(ClusterSecret given, ClusterSecret::Load(flags.cluster_secret_file));
    secret = given.value();
  } else {
    secret = ClusterSecret::Random().value();  // only this process's nodes know it
  }
  coordinator::CoordinatorNodeOptions coordinator_options;
  coordinator_options.listen = flags.listen;
  coordinator_options.cluster_secret = secret;
  coordinator_options.registry.strict_modes = flags.strict_modes;
  SCD_RETURN_IF_ERROR(
      flags.public_api.Apply(&coordinator_options.limits, &coordinator_options.guards));
  coordinator_options.max_message_bytes = flags.public_api.max_message_bytes();
  if (!flags.producer_model.empty() && fs::is_directory(flags.producer_model) &&
      fs::exists(fs::path(flags.producer_model) / "tokenizer.json")) {
    coordinator_options.tokenizer = flags.producer_model;  // cache-aware routing of text prompts
  }
  SCD_ASSIGN_OR_RETURN(auto coordinator, coordinator::CoordinatorNode::Start(coordinator_options));
  // A path that is a file (config.json) rather than a model directory: seeded dummy weights.
  auto spec_of = [&](const std::string& path, uint64_t seed) {
    ServedModelSpec spec;
    (fs::is_regular_file(path) ? spec.dummy_config : spec.model_dir) = path;
    spec.layers = flags.layers;
    spec.seed = seed;
    spec.device = flags.device;
    spec.dtype = flags.dtype;
    return spec;
  };
  producer::ProducerNodeOptions producer_options;
  producer_options.model = spec_of(
      flags.producer_dummy.empty() ? flags.producer_model : flags.producer_dummy,
      flags.producer_seed);
  producer_options.transport = "inproc";
  producer_options.coordinator = coordinator->control_address();
  producer_options.cluster_secret = secret;
  producer_options.prefix_cache_mb = flags.prefix_cache_mb;
  std::vector<consumer::ConsumerNodeOptions> consumer_options;
  for (const std::string& spec : flags.consumers) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--consumer ", spec, ": expected NAME=DIR[:ARTIFACT]"));
    }
    consumer::ConsumerNodeOptions options = flags.consumer;
    const std::string rest = spec.substr(eq + 1);
    const size_t colon = rest.find(':');
    options.model = spec_of(rest.substr(0, colon), flags.consumer_seed);
    options.model.name = spec.substr(0, eq);
    if (colon != std::string::npos) {
      options.artifacts.push_back(rest.substr(colon + 1));
      producer_options.artifacts.push_back(rest.substr(colon + 1));
    }
    options.transport = "inproc";
    options.transfer_listen = options.model.name + ":0";
    options.coordinator = coordinator->control_address();
    options.cluster_secret = secret;
    options.prefix_cache_mb = flags.prefix_cache_mb;
    consumer_options.push_back(options);
  }
  SCD_ASSIGN_OR_RETURN(auto producer, producer::ProducerNode::Start(producer_options));
  std::vector<std::unique_ptr<consumer::ConsumerNode>> consumers;
  for (const auto& options : consumer_options) {
    SCD_ASSIGN_OR_RETURN(auto node, consumer::ConsumerNode::Start(options));
    // The coordinator reaches the consumer inside the process: every token event crosses it.
    coordinator->UseChannel(node->control_address(), node->InProcessControlChannel());
    consumers.push_back(std::move(node));
  }
  // Serve once every node is routable (each registration wakes the wait).
  coordinator::NodeRegistry& registry = coordinator->registry();
  if (!registry.AwaitSize(consumers.size() + 1, registry.clock()->Now() + absl::Seconds(30))) {
    return absl::DeadlineExceededError("nodes did not register");
  }
  // The public API's view: the coordinator's metrics (what clients asked and got).
  if (http) http->SetHandler(coordinator->http_handler());
  SCD_RETURN_IF_ERROR(WriteAddressFile(flags.address_file, coordinator->address()));
  SCD_RETURN_IF_ERROR(
      WriteAddressFile(flags.control_address_file, coordinator->control_address()));
  spdlog::warn("scd serve: all-in-one serving on {} (producer {}, {} consumers)",
               coordinator->address(), producer->name(), consumers.size());
  const std::string signal = WaitForTerminationSignal();
  spdlog::warn("scd serve: {}: draining", signal);
  LogTrimmed(trimmer.get());
  if (http) http->SetDraining();
  for (auto& node : consumers) node->Drain();
  for (auto& node : consumers) node->Shutdown(absl::Seconds(flags.drain_seconds));
  producer->Shutdown(absl::Seconds(1));
  if (http) http->Stop();
  coordinator->Shutdown(absl::Seconds(1));
  return absl::OkStatus();
}

absl::Status RunGenerate(const CommonFlags& common, const GenerateFlags& flags) {
  if (!flags.server.empty()) return RunRemoteGenerate(flags);
  if (common.model.empty()) return absl::InvalidArgumentError("give --model DIR or --server");
  SCD_ASSIGN_OR_RETURN(LlamaModel::Options options, RuntimeOptions(common));
  std::unique_ptr<LlamaModel> model;
  if (flags.dummy_weights) {
    SCD_ASSIGN_OR_RETURN(model,
                         LlamaModel::DummyFromConfig(common.model, flags.generation.sampling.seed,
                                                     flags.layers, options));
  } else {
    if (flags.layers > 0) return absl::InvalidArgumentError("--layers needs --dummy-weights");
    SCD_ASSIGN_OR_RETURN(model, LlamaModel::Load(common.model, options));
  }
  const GenerationOptions& gen = flags.generation;
  GenerationResult result;
  const fs::path tokenizer_path = fs::path(common.model) / "tokenizer.json";
  if (!flags.prompt_ids.empty()) {
    SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids, ParseIds(flags.prompt_ids));
    if (fs::exists(tokenizer_path)) {
      SCD_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(tokenizer_path.string()));
      WriteOut(tokenizer->Decode(ids, /*skip_special_tokens=*/true));
      SCD_ASSIGN_OR_RETURN(result, GenerateTextFromIds(*model, *tokenizer, ids, gen, WriteOut));
    } else {
      // No tokenizer (e.g. a bare config with dummy weights): stream the ids themselves.
      if (!gen.stop_strings.empty()) {
        return absl::InvalidArgumentError("--stop needs a tokenizer.json beside the model");
      }
      KvCache cache = model->NewCache(static_cast<int64_t>(ids.size()) + gen.max_tokens);
      SCD_ASSIGN_OR_RETURN(result, GenerateTokens(*model, ids, &cache, gen, [&](TokenId id) {
                             WriteOut(absl::StrCat(id, " "));
                             return true;
                           }));
    }
  } else {
    if (!fs::exists(tokenizer_path)) {
      return absl::NotFoundError(
          absl::StrCat(tokenizer_path.string(), " not found: give the prompt as --prompt-ids"));
    }
    SCD_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(tokenizer_path.string()));
    WriteOut(flags.prompt);
    SCD_ASSIGN_OR_RETURN(result, GenerateText(*model, *tokenizer, flags.prompt, gen, WriteOut));
  }
  WriteOut("\n");
  const size_t n = result.output_ids.size();
  const std::string summary = absl::StrFormat(
      "prompt %d tokens, prefill+first token %.1f ms; %d tokens generated, decode %.1f tokens/s; "
      "finish: %s",
      result.prompt_ids.size(), 1e3 * result.prefill_seconds, n,
      n > 1 && result.decode_seconds > 0 ? (n - 1) / result.decode_seconds : 0.0,
      FinishReasonName(result.finish_reason));
  if (flags.stats) {
    std::fprintf(stderr, "%s\n", summary.c_str());
  } else {
    spdlog::info("{}", summary);
  }
  return absl::OkStatus();
}

absl::Status RunTokenize(const CommonFlags& common, const std::string& text, bool pieces,
                         bool no_special) {
  const std::string path = (fs::path(common.model) / "tokenizer.json").string();
  SCD_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(path));
  SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids, tokenizer->Encode(text, !no_special));
  std::string out;
  if (pieces) {
    for (TokenId id : ids) {
      absl::StrAppend(&out, id, "\t", tokenizer->IdToToken(id).value_or("?"), "\n");
    }
  } else {
    for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&out, i ? " " : "", ids[i]);
    out += "\n";
  }
  WriteOut(out);
  return absl::OkStatus();
}

absl::Status RunInfo(const CommonFlags& common) {
  const std::string config_path = ConfigPath(common.model);
  SCD_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(config_path));
  std::string out = absl::StrCat("config              ", config_path, "\n", config.Summary());
  if (fs::is_directory(common.model)) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(common.model);
    if (ckpt.ok()) {
      int64_t stored = 0;
      for (const std::string& name : (*ckpt)->names()) stored += (*ckpt)->Find(name)->numel();
      absl::StrAppendFormat(&out, "weights             %d tensors, %d parameters stored%s\n",
                            (*ckpt)->names().size(), stored,
                            (*ckpt)->sharded() ? " (sharded)" : "");
    } else {
      absl::StrAppend(&out, "weights             none (", ckpt.status().message(), ")\n");
    }
  }
  WriteOut(out);
  return absl::OkStatus();
}

absl::Status RunKernels(bool others_only) {
  const CpuFeatures cpu = DetectCpuFeatures();
  const std::string in_use = OpenBlasCoreInUse();
  const std::optional<IsaLevel> in_use_level = OpenBlasCoreLevel(in_use);
  std::vector<std::string> others;
  for (const std::string& core : RunnableOpenBlasCores(cpu)) {
    if (OpenBlasCoreLevel(core) != in_use_level) others.push_back(core);
  }
  if (others_only) {
    // Without OpenBLAS there is no other kernel to run under (OPENBLAS_CORETYPE means nothing).
    if (!in_use.empty()) {
      for (const std::string& core : others) WriteOut(core + "\n");
    }
    return absl::OkStatus();
  }
  WriteOut(absl::StrCat(
      "in use:   ", BlasKernelReport(), "\n", "cpu:      ", IsaLevelName(cpu.level()), "; ",
      cpu.brand, " (", cpu.vendor, ", family ", cpu.family, " model ", cpu.model, ")\n",
      "runnable: ", absl::StrJoin(RunnableOpenBlasCores(cpu), " "), " (OPENBLAS_CORETYPE=...)\n"));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  CLI::App app{"SCD Serve model runtime: generate, tokenize, inspect Llama-family checkpoints"};
  app.require_subcommand(1);
  CommonFlags common;
  auto add_common = [&](CLI::App* cmd, bool runtime) {
    auto* model = cmd->add_option("--model", common.model, "Hugging Face model directory");
    if (cmd->get_name() != "generate") model->required();  // generate: or --server
    AddCommonFlags(cmd, &common.tool, runtime ? kThreadsFlag | kLogLevelFlag : kLogLevelFlag);
    if (runtime) {
      cmd->add_option("--device", common.device, "cpu, cuda or cuda:N")->capture_default_str();
      cmd->add_option("--dtype", common.dtype, "f32, bf16, f16 or int8 (on a CPU: weights at that precision, activations f32)")->capture_default_str();
    }
  };

  GenerateFlags gen;
  CLI::App* generate = app.add_subcommand("generate", "stream a continuation of a prompt");
  add_common(generate, true);
  auto* prompt_opt = generate->add_option("--prompt", gen.prompt, "prompt text");
  auto* ids_opt = generate->add_option("--prompt-ids", gen.prompt_ids,
                                       "prompt as token ids, e.g. 1,403,407 (no tokenizer needed)");
  prompt_opt->excludes(ids_opt);
  GenerationOptions& g = gen.generation;
  generate->add_option("--max-tokens", g.max_tokens, "new tokens at most")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  generate->add_option("--temperature", g.sampling.temperature, "0 = greedy")
      ->capture_default_str();
  generate->add_option("--top-k", g.sampling.top_k, "0 = off")->capture_default_str();
  generate->add_option("--top-p", g.sampling.top_p, "nucleus sampling mass")->capture_default_str();
  generate->add_option("--seed", g.sampling.seed, "sampling (and dummy-weight) seed")
      ->capture_default_str();
  generate->add_option("--stop-id", g.stop_token_ids, "stop token id (repeatable; default: eos)");
  generate->add_option("--stop", g.stop_strings, "stop at this text, not printed (repeatable)");
  generate->add_flag("--ignore-eos", g.ignore_eos, "do not stop at eos");
  generate->add_flag("--dummy-weights", gen.dummy_weights,
                     "seeded random weights from config.json alone (speed work)");
  generate->add_option("--layers", gen.layers,
                       "with --dummy-weights: keep only the first N layers");
  generate->add_flag("--stats", gen.stats, "print timing to stderr");
  AddTlsFlags(generate, &gen.tls, /*server=*/false);
  generate->add_option("--server", gen.server,
                       "send the request to a serving API (coordinator or consumer) instead; "
                       "HOST:PORT,HOST:PORT,...: a deployment's coordinators, the stream resumed "
                       "through the next when its coordinator goes away");
  generate->add_option("--target", gen.targets, "with --server: consumer model (repeat: fan-out)");
  generate->add_option("--mode", gen.mode,
                       "with --server: auto, scd, reuse, raw, int4, "
                       "recompute or local");
  generate->add_flag("--json", gen.json, "with --server: every event as one JSON line");
  generate->add_flag("--no-local-fallback", gen.no_local_fallback,
                     "with --server: end with the transfer's error when it fails, instead of "
                     "prefilling locally (the default)");

  ServeFlags serve_flags;
  CLI::App* serve =
      app.add_subcommand("serve", "serve the Inference API (all roles in one process)");
  serve->add_flag("--all-in-one", serve_flags.all_in_one,
                  "coordinator, producer and consumers here");
  CLI::Option* producer_model = serve->add_option(
      "--producer-model", serve_flags.producer_model,
      "the producer's model directory (a config.json: dummy weights)");
  CLI::Option* producer_dummy = serve->add_option(
      "--dummy-weights", serve_flags.producer_dummy,
      "the producer: seeded random weights for this config.json (timings at real sizes, no "
      "fidelity)");
  producer_model->excludes(producer_dummy);
  serve->add_option("--layers", serve_flags.layers,
                    "dummy weights: keep only the first N layers of every model")
      ->check(CLI::NonNegativeNumber);
  serve->add_option("--seed", serve_flags.producer_seed, "the producer's dummy-weight seed")
      ->capture_default_str();
  serve->add_option("--consumer-seed", serve_flags.consumer_seed,
                    "the consumers' dummy-weight seed")
      ->capture_default_str();
  serve->add_option("--device", serve_flags.device, "cpu, cuda or cuda:N")->capture_default_str();
  serve->add_option("--dtype", serve_flags.dtype, "f32, bf16, f16 or int8 (on a CPU: weights at that precision, activations f32)")->capture_default_str();
  serve
      ->add_option("--consumer", serve_flags.consumers,
                   "NAME=DIR|CONFIG[:ARTIFACT]: a consumer model (a config.json: dummy weights) "
                   "and its artifact (repeatable)")
      ->required();
  serve->add_option("--listen", serve_flags.listen, "the public API's address (port 0: any)");
  serve->add_option("--address-file", serve_flags.address_file, "write the address here");
  serve->add_option("--http-listen", serve_flags.http_listen,
                    "HTTP address of the OpenAI-compatible API (/v1/completions, "
                    "/v1/chat/completions, /v1/models), /health and /metrics (port 0: any)");
  serve->add_option("--http-address-file", serve_flags.http_address_file,
                    "write the HTTP address here once listening");
  AddTlsFlags(serve, &serve_flags.tls, /*server=*/true);
  AddPublicApiFlags(serve, &serve_flags.public_api);
  serve->add_option("--control-address-file", serve_flags.control_address_file,
                    "write the (loopback) control plane's address here");
  serve->add_option("--cluster-secret-file", serve_flags.cluster_secret_file,
                    "the control plane's secret (default: $SCD_CLUSTER_SECRET, else a random one)")
      ->check(CLI::ExistingFile);
  AddConsumerBatchingFlags(serve, &serve_flags.consumer);
  serve->add_option("--prefix-cache-mb", serve_flags.prefix_cache_mb,
                    "prefix cache budget of the producer and of each consumer, MiB (0: off)")
      ->check(CLI::Range(0, 1 << 20));
  serve->add_option("--drain-seconds", serve_flags.drain_seconds, "SIGTERM: wait for requests")
      ->check(CLI::Number)->check(CLI::Range(0.0, 86400.0));
  serve->add_flag("--strict-modes", serve_flags.strict_modes,
                  "refuse raw/int4/reuse between different weights instead of serving them");
  AddMemoryFlags(serve, &serve_flags.memory);
  AddCommonFlags(serve, &common.tool, kLogLevelFlag | kThreadsFlag);

  std::string text;
  bool pieces = false, no_special = false;
  CLI::App* tokenize = app.add_subcommand("tokenize", "print the token ids of a text");
  add_common(tokenize, false);
  tokenize->add_option("text", text, "text to tokenize")->required();
  tokenize->add_flag("--pieces", pieces, "one 'id<TAB>token' line per token");
  tokenize->add_flag("--no-special", no_special, "do not add BOS/special tokens");

  CLI::App* info =
      app.add_subcommand("info", "config summary, parameter count, KV bytes per token");
  add_common(info, false);

  bool other_kernels = false;
  CLI::App* kernels = app.add_subcommand(
      "kernels", "the BLAS kernels in use and the ones this CPU can run (model/blas_kernel.h)");
  kernels->add_flag("--others", other_kernels,
                    "only the runnable OpenBLAS cores of another ISA level than the one in use, "
                    "one per line (scripts/numeric_kernels.sh)");

  ExportGgufFlags export_flags;
  CLI::App* export_gguf = app.add_subcommand(
      "export-gguf", "write a checkpoint (or dummy weights) as a GGUF file for llama.cpp");
  AddExportGgufFlags(export_gguf, &export_flags);
  AddCommonFlags(export_gguf, &common.tool, kLogLevelFlag);

  return RunTool("scd", app, argc, argv, common.tool, [&]() -> absl::Status {
    if (kernels->parsed()) return RunKernels(other_kernels);
    if (export_gguf->parsed()) return RunExportGguf(export_flags);
    if (generate->parsed()) {
      if (gen.prompt.empty() && gen.prompt_ids.empty()) {
        return absl::InvalidArgumentError("give --prompt TEXT or --prompt-ids IDS");
      }
      return RunGenerate(common, gen);
    }
    if (tokenize->parsed()) return RunTokenize(common, text, pieces, no_special);
    if (serve->parsed()) return RunServe(serve_flags, common.tool.threads);
    return RunInfo(common);
  });
}

}  // namespace
}  // namespace scd

int main(int argc, char** argv) { return scd::Main(argc, argv); }
