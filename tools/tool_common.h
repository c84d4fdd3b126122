// What every command-line tool shares: the common flags (threads, log level, quiet, shared
// folder), logging set-up, and one way of ending: a failed command prints exactly one
// "<tool>: error: <message>" line on stderr and exits with status 1; nothing thrown escapes.
// Thread-safety: call from main() only.
#ifndef SCD_TOOLS_TOOL_COMMON_H_
#define SCD_TOOLS_TOOL_COMMON_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/grpc_tls.h"
#include "base/http_server.h"
#include "base/process_memory.h"
#include "codec/served_model_spec.h"
#include "proto/request_validation.h"
#include "serving/checked_inference.h"

namespace scd {

struct CommonToolFlags {
  int threads = 0;                 // compute threads, 0 = all cores
  std::string log_level = "warn";  // spdlog level
  bool quiet = false;              // no progress bars
  std::string shared_dir;          // "" = resolved at run time (base/shared_dir.h)

  // The shared folder: --shared-dir, then $SCD_SHARED_DIR, then shared/ beside the checkout.
  std::string SharedDir() const;
};

enum CommonFlag : unsigned {
  kThreadsFlag = 1,
  kLogLevelFlag = 2,
  kQuietFlag = 4,
  kSharedDirFlag = 8,
  kAllCommonFlags = 15,
};

// Registers the chosen common flags on `command`, bound to `flags`.
void AddCommonFlags(CLI::App* command, CommonToolFlags* flags, unsigned which = kAllCommonFlags);

// Parses argv, sets up logging from `flags`, runs `run` and turns its status (or anything it
// throws) into the exit code. Returns the process exit status.
int RunTool(const char* tool, CLI::App& app, int argc, char** argv, const CommonToolFlags& flags,
            const std::function<absl::Status()>& run);

// ---- Daemons (scd-coordinator, scd-producer, scd-consumer) ----

// What an operator limits on a public API (coordinator, consumer, all-in-one):
// --api-token-file (else $SCD_API_TOKEN), --max-requests-per-client, --max-prompt-tokens,
// --max-output-tokens, --max-message-mb.
struct PublicApiFlags {
  std::string api_token_file;
  uint32_t max_requests_per_client = 0;
  uint32_t max_prompt_tokens = 0;
  uint32_t max_output_tokens = 0;  // 0 = RequestLimits' bound
  double max_message_mb = 4;
  // Fills the guards' token (the file's first line, else $SCD_API_TOKEN, else none) and limits.
  absl::Status Apply(RequestLimits* limits, PublicApiGuards* guards) const;
  size_t max_message_bytes() const { return static_cast<size_t>(max_message_mb * (1 << 20)); }
};
void AddPublicApiFlags(CLI::App* app, PublicApiFlags* flags);

// How a long-running process keeps its freed memory from piling up (base/process_memory.h):
// --memory-trim-seconds (a MemoryTrimmer) and --malloc-arenas (LimitMallocArenas). Every daemon
// and `scd serve --all-in-one` has them.
struct MemoryFlags {
  double trim_seconds = 10;  // 0: never
  int malloc_arenas = 2;     // 0: glibc's own (8 per CPU)
};
void AddMemoryFlags(CLI::App* app, MemoryFlags* flags);
// Limits the malloc arenas (call before the process starts threads of its own; a refusal is
// logged) and starts the trimmer (nullptr when --memory-trim-seconds is 0).
std::unique_ptr<MemoryTrimmer> ApplyMemoryFlags(const MemoryFlags& flags);
// Logs what the trimmer handed back, at shutdown (nothing for nullptr).
void LogTrimmed(const MemoryTrimmer* trimmer);

// The flags every daemon has besides its own: the common ones, --config FILE.toml,
// --drain-seconds, MemoryFlags, --address-file, --control-address-file,
// --cluster-secret-file,
// --http-listen (GET /health and /metrics; the coordinator's OpenAI-compatible API),
// --http-address-file.
struct DaemonFlags {
  DaemonFlags() { common.log_level = "info"; }
  CommonToolFlags common;
  double drain_seconds = 30;
  MemoryFlags memory;
  std::string address_file;
  std::string control_address_file;
  std::string cluster_secret_file;  // "" = $SCD_CLUSTER_SECRET
  std::string http_listen;          // "" = no HTTP listener
  std::string http_address_file;
  TlsFiles tls;                     // --tls-cert, --tls-key, --tls-ca, ... (AddTlsFlags)
  PublicApiFlags public_api;        // bound by daemons with a public API (AddPublicApiFlags)

  // The cluster secret (proto/cluster_secret.h): the file, else the environment; an error that
  // says how to give one.
  absl::StatusOr<std::string> ClusterSecret() const;
};
void AddDaemonFlags(CLI::App* app, DaemonFlags* flags, unsigned common_flags);

// --tls-cert, --tls-key, --tls-ca, --tls-server-name (base/grpc_tls.h); `server`: also
// --tls-require-client-cert.
void AddTlsFlags(CLI::App* app, TlsFiles* tls, bool server);
// The HTTP listener's options for --http-listen with the process's TLS files.
HttpServerOptions HttpOptions(const std::string& listen, const TlsFiles& tls,
                              size_t max_body_bytes);



// A started node as the daemon's life cycle sees it: where it serves and how it drains.
struct DaemonHandle {
  std::string address;          // public API (a producer: its control address)
  std::string control_address;  // control plane
  std::function<void(absl::Duration grace)> shutdown;
  std::shared_ptr<HttpHandler> http;  // what --http-listen serves once the node is up

  // Keeps `node` (anything with address(), control_address(), http_handler() and
  // Shutdown(absl::Duration)) alive in the handle.
  template <typename Node>
  static DaemonHandle Of(std::unique_ptr<Node> node) {
    std::shared_ptr<Node> owned = std::move(node);
    return {owned->address(), owned->control_address(),
            [owned](absl::Duration grace) { owned->Shutdown(grace); }, owned->http_handler()};
  }
};

// A daemon's main after its flags are declared: catches SIGTERM/SIGINT (base/termination_signal.h:
// one that arrives while it loads drains it once it is up), parses (RunTool), logs to
// stderr as `tool`, raises the open-file limit (base/connection_gate.h), listens on --http-listen
// (its /health says "loading" until the node is up; --http-address-file), starts the node with
// `start`, writes --address-file and --control-address-file, hands freed memory back to the
// system every --memory-trim-seconds (MemoryTrimmer; malloc arenas limited to --malloc-arenas
// before any thread of its own starts), waits for SIGTERM or SIGINT, then
// drains for up to --drain-seconds (/health: "draining") and exits 0.
int RunDaemon(const char* tool, CLI::App& app, int argc, char** argv, const DaemonFlags& flags,
              const std::function<absl::StatusOr<DaemonHandle>()>& start);

// --model DIR | --dummy-weights CONFIG [--layers N] [--seed S], --name, --device, --dtype.
void AddServedModelFlags(CLI::App* app, ServedModelSpec* spec);

// The flags the producer and the consumer share, bound to their options structs.
template <typename NodeOptions>
void AddServingNodeFlags(CLI::App* app, NodeOptions* options, const char* artifact_help) {
  AddServedModelFlags(app, &options->model);
  app->add_option("--control-listen", options->control_listen,
                  "control-plane gRPC address, for the coordinator only (port 0: any free port)");
  app->add_option("--advertise", options->advertise,
                  "host other nodes dial (default: the listen host; a wildcard: the host name)");
  CLI::Option* coordinator = app->add_option(
      "--coordinator", options->coordinator,
      "the coordinator's control address (none: standalone)");
  app->add_option("--registry", options->coordinator,
                  "etcd://HOST:PORT: register in this etcd under a 10 s lease (every coordinator "
                  "watching it routes here) instead of at one coordinator")
      ->excludes(coordinator);
  app->add_option("--transport", options->transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}));
  app->add_option("--artifact", options->artifacts, artifact_help);
  app->add_option("--prefix-cache-mb", options->prefix_cache_mb,
                  "prefix cache budget in MiB: prefixes it has run are reused by later requests "
                  "(0: off)")
      ->check(CLI::Range(0, 1 << 20));
}

// A consumer's batching and admission flags (scd-consumer and scd serve --all-in-one), bound to
// its ConsumerNodeOptions: --capacity, --kv-cache-mb, --max-queued, --max-batched-tokens,
// --transfer-timeout, --allow-precision-mismatch.
template <typename ConsumerOptions>
void AddConsumerBatchingFlags(CLI::App* app, ConsumerOptions* options) {
  app->add_flag("--allow-precision-mismatch", options->allow_precision_mismatch,
                "serve an artifact fitted at another weight precision than --dtype (logged with "
                "the fidelity it was measured at) instead of refusing it");
  app->add_option("--capacity", options->capacity,
                  "sequences a consumer runs at once (an upper bound: admission counts KV memory)")
      ->check(CLI::TypeValidator<uint32_t>())
      ->check(CLI::Range(1, 4096));
  app->add_option("--kv-cache-mb", options->kv_cache_mb,
                  "KV memory a consumer admits requests into, MiB; a request reserves (prompt + "
                  "max_tokens) positions (0: capacity x the model's context, at most half the "
                  "machine's memory; fractions allowed)")
      ->check(CLI::Range(0.0, 16777216.0));
  app->add_option("--max-queued", options->max_queued,
                  "requests waiting for KV memory at once; more are refused (0: refuse at once)")
      ->check(CLI::TypeValidator<uint32_t>())
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--max-batched-tokens", options->max_batched_tokens,
                  "rows of one batched step: running decodes plus chunks of prefills and "
                  "rebuilds")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--scheduler-nice", options->scheduler_nice,
                  "how much nicer than the process the decode loop's thread runs, so the threads "
                  "answering the network (cancels, deadlines, admissions, event writes) preempt "
                  "it on a busy CPU (0: as the process)")
      ->check(CLI::Range(0, 19));
  app->add_option("--step-threads", options->step_threads,
                  "threads running requests' steps (their start; taking a transfer's chunks: "
                  "the checksum, unframing), fixed whatever the number of requests")
      ->check(CLI::Range(1, 64));
  app->add_option_function<double>(
         "--transfer-timeout",
         [options](double seconds) { options->transfer_timeout = absl::Seconds(seconds); },
         "seconds a transfer may stall (no session, no chunk) before its request gives up its "
         "reservation and fails, or falls back to a local prefill when allowed (default 30)")
      ->check(CLI::Range(0.01, 86400.0));
}

// Writes `address` and a newline to `path` (temp file + rename: readers never see half of it);
// nothing when `path` is empty. Lets scripts and tests find a daemon that listened on port 0.
absl::Status WriteAddressFile(const std::string& path, const std::string& address);

}  // namespace scd

#endif  // SCD_TOOLS_TOOL_COMMON_H_
