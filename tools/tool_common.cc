#include "tools/tool_common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/connection_gate.h"
#include "base/exception_guard.h"
#include "base/file_util.h"
#include "base/process_memory.h"
#include "base/shared_dir.h"
#include "base/termination_signal.h"
#include "proto/cluster_secret.h"
#include "tools/toml_config.h"

namespace scd {

std::string CommonToolFlags::SharedDir() const { return ResolveSharedDir(shared_dir); }

void AddCommonFlags(CLI::App* command, CommonToolFlags* flags, unsigned which) {
  if (which & kThreadsFlag) {
    command->add_option("--threads", flags->threads, "compute threads (0 = all cores)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
  }
  if (which & kLogLevelFlag) {
    command->add_option("--log-level", flags->log_level, "trace|debug|info|warn|error|off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
        ->capture_default_str();
  }
  if (which & kQuietFlag) command->add_flag("--quiet", flags->quiet, "no progress output");
  if (which & kSharedDirFlag) {
    command->add_option("--shared-dir", flags->shared_dir,
                        "shared folder with models and data (default: $SCD_SHARED_DIR, else "
                        "shared/ beside the checkout)");
  }
}

int RunTool(const char* tool, CLI::App& app, int argc, char** argv, const CommonToolFlags& flags,
            const std::function<absl::Status()>& run) {
  // Debian's Abseil is built without NDEBUG, so every Mutex lock would also update a global lock
  // graph to detect deadlocks (one more global lock, and 3 % of a coordinator's CPU measured with
  // perf): tests keep it, the tools run without it. Before any thread of ours starts.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%l] %v");
  const absl::Status status = GuardExceptions("unexpected failure", run);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", tool, std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

void AddServedModelFlags(CLI::App* app, ServedModelSpec* spec) {
  CLI::Option* model = app->add_option("--model", spec->model_dir, "Hugging Face model directory");
  CLI::Option* dummy = app->add_option(
      "--dummy-weights", spec->dummy_config,
      "serve seeded random weights for this config.json instead (timings at real sizes, no "
      "fidelity; token ids only unless a tokenizer.json is beside it)");
  model->excludes(dummy);
  app->add_option("--layers", spec->layers, "with --dummy-weights: keep only the first N layers")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--seed", spec->seed,
                  "with --dummy-weights: the weights' seed (as given to scd-calib synth)");
  app->add_option("--name", spec->name,
                  "routing name (default: the directory's name, or the config file's stem)");
  app->add_option("--device", spec->device, "cpu, cuda or cuda:N")->capture_default_str();
  app->add_option("--dtype", spec->dtype, "f32, bf16 or f16")->capture_default_str();
}

void AddMemoryFlags(CLI::App* app, MemoryFlags* flags) {
  app->add_option("--memory-trim-seconds", flags->trim_seconds,
                  "hand the allocator's freed memory back to the system this often (glibc "
                  "malloc_trim; without it a long-running node's RSS creeps up; 0: never)")
      ->check(CLI::Number)
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app->add_option("--malloc-arenas", flags->malloc_arenas,
                  "at most this many glibc malloc arenas (each thread would get its own up to 8 "
                  "per CPU, and each keeps pages no trim returns; 0: glibc's default)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
}

std::unique_ptr<MemoryTrimmer> ApplyMemoryFlags(const MemoryFlags& flags) {
  if (flags.malloc_arenas > 0 && !LimitMallocArenas(flags.malloc_arenas)) {
    spdlog::warn("--malloc-arenas {}: the allocator refused (not glibc's malloc)",
                 flags.malloc_arenas);
  }
  if (flags.trim_seconds <= 0) return nullptr;
  return std::make_unique<MemoryTrimmer>(absl::Seconds(flags.trim_seconds));
}

void LogTrimmed(const MemoryTrimmer* trimmer) {
  if (trimmer == nullptr) return;
  spdlog::info("freed memory handed back: {:.1f} MB in {} trims",
               static_cast<double>(trimmer->released_bytes()) / (1 << 20), trimmer->trims());
}

void AddDaemonFlags(CLI::App* app, DaemonFlags* flags, unsigned common_flags) {
  app->add_option("--drain-seconds", flags->drain_seconds,
                  "how long SIGTERM waits for running requests")
      ->check(CLI::Number)
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  AddMemoryFlags(app, &flags->memory);
  app->add_option("--address-file", flags->address_file,
                  "write the bound address here once serving");
  app->add_option("--control-address-file", flags->control_address_file,
                  "write the control plane's bound address here once serving");
  app->add_option("--cluster-secret-file", flags->cluster_secret_file,
                  "the cluster secret every node shares (default: $SCD_CLUSTER_SECRET)")
      ->check(CLI::ExistingFile);
  app->add_option("--http-listen", flags->http_listen,
                  "HTTP address for GET /health and /metrics (Prometheus) and, on a coordinator, "
                  "the OpenAI-compatible API (port 0: any free port; none: no HTTP)");
  app->add_option("--http-address-file", flags->http_address_file,
                  "write the HTTP listener's bound address here once listening");
  AddTlsFlags(app, &flags->tls, /*server=*/true);
  AddCommonFlags(app, &flags->common, common_flags);
  AddConfigFileFlag(app);
}

void AddTlsFlags(CLI::App* app, TlsFiles* tls, bool server) {
  app->add_option("--tls-cert", tls->cert,
                  server ? "TLS: this node's certificate chain (PEM); every gRPC and HTTP listener "
                           "serves TLS, and the node presents it to peers that ask (mutual TLS)"
                         : "mutual TLS: the client certificate chain (PEM) to present")
      ->check(CLI::ExistingFile);
  app->add_option("--tls-key", tls->key, "TLS: the certificate's private key (PEM)")
      ->check(CLI::ExistingFile);
  if (server) {
    app->add_flag("--tls-require-client-cert", tls->require_client_cert,
                  "mutual TLS: clients must present a certificate signed by --tls-ca");
  }
  app->add_option("--tls-ca", tls->ca,
                  "TLS: the CA bundle (PEM) servers' certificates are checked against (and, "
                  "with --tls-require-client-cert, clients')")
      ->check(CLI::ExistingFile);
  app->add_option("--tls-server-name", tls->server_name,
                  "TLS: check servers' certificates for this name instead of the host dialled "
                  "(nodes dial each other at registered IPs: on Kubernetes the nodes share a "
                  "certificate for one name, deploy/k8s/components/tls)");
}

HttpServerOptions HttpOptions(const std::string& listen, const TlsFiles& tls,
                              size_t max_body_bytes) {
  HttpServerOptions options;
  options.listen = listen;
  options.max_body_bytes = max_body_bytes;
  options.tls_cert = tls.cert;
  options.tls_key = tls.key;
  if (tls.require_client_cert) options.tls_client_ca = tls.ca;
  return options;
}

void AddPublicApiFlags(CLI::App* app, PublicApiFlags* flags) {
  app->add_option("--api-token-file", flags->api_token_file,
                  "a bearer token the public APIs require (gRPC `authorization: Bearer T`, HTTP "
                  "Authorization; default: $SCD_API_TOKEN, none when unset)")
      ->check(CLI::ExistingFile);
  app->add_option("--max-requests-per-client", flags->max_requests_per_client,
                  "requests one client address may run at once (0: no limit)")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--max-prompt-tokens", flags->max_prompt_tokens,
                  "longest prompt accepted, in tokens (0: the model's room)")
      ->check(CLI::Range(0, 1 << 24));
  app->add_option("--max-output-tokens", flags->max_output_tokens,
                  "largest max_tokens accepted (0: 2^20)")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--max-message-mb", flags->max_message_mb,
                  "largest request message (gRPC) or body (HTTP) accepted, MiB")
      ->check(CLI::Range(0.01, 1024.0))
      ->capture_default_str();
}

absl::Status PublicApiFlags::Apply(RequestLimits* limits, PublicApiGuards* guards) const {
  if (!api_token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(api_token_file);
    if (!text.ok()) return text.status();
    guards->api_token = std::string(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (guards->api_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--api-token-file ", api_token_file,
                                                     ": empty"));
    }
  } else if (const char* env = std::getenv("SCD_API_TOKEN"); env != nullptr && *env != '\0') {
    guards->api_token = env;
  }
  guards->max_requests_per_client = max_requests_per_client;
  guards->max_prompt_tokens = max_prompt_tokens;
  if (max_output_tokens > 0) limits->max_tokens = max_output_tokens;
  return absl::OkStatus();
}

int RunDaemon(const char* tool, CLI::App& app, int argc, char** argv, const DaemonFlags& flags,
              const std::function<absl::StatusOr<DaemonHandle>()>& start) {
  CatchTerminationSignals();  // before any thread of ours starts, so every one inherits the mask
  return RunTool(tool, app, argc, argv, flags.common, [&]() -> absl::Status {
    spdlog::set_default_logger(spdlog::stderr_color_mt(tool));  // stdout: nothing
    spdlog::info("open files: up to {}", RaiseOpenFileLimit());
    const std::unique_ptr<MemoryTrimmer> trimmer = ApplyMemoryFlags(flags.memory);
    if (absl::Status tls = ConfigureTls(flags.tls); !tls.ok()) return tls;
    std::unique_ptr<HttpServer> http;
    if (!flags.http_listen.empty()) {
      absl::StatusOr<std::unique_ptr<HttpServer>> started =
          HttpServer::Start(HttpOptions(flags.http_listen, flags.tls,
                                        flags.public_api.max_message_bytes()));
      if (!started.ok()) return started.status();
      http = *std::move(started);
      spdlog::info("HTTP (/health, /metrics) on {}", http->address());
      absl::Status written = WriteAddressFile(flags.http_address_file, http->address());
      if (!written.ok()) return written;
    }
    absl::StatusOr<DaemonHandle> node = start();
    if (!node.ok()) return node.status();
    if (http) http->SetHandler(node->http);
    absl::Status written = WriteAddressFile(flags.address_file, node->address);
    if (!written.ok()) return written;
    written = WriteAddressFile(flags.control_address_file, node->control_address);
    if (!written.ok()) return written;
    const std::string signal = WaitForTerminationSignal();
    spdlog::info("{}: draining", signal);
    LogTrimmed(trimmer.get());
    if (http) http->SetDraining();
    node->shutdown(absl::Seconds(flags.drain_seconds));
    if (http) http->Stop();  // before the node (its handler's state) goes
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> DaemonFlags::ClusterSecret() const {
  absl::StatusOr<scd::ClusterSecret> secret = ClusterSecret::Load(cluster_secret_file);
  if (!secret.ok()) return secret.status();
  return secret->value();
}

absl::Status WriteAddressFile(const std::string& path, const std::string& address) {
  if (path.empty()) return absl::OkStatus();
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    out << address << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace scd
