#include "consumer/consumer_node.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/status_macros.h"
#include "codec/fingerprint.h"
#include "proto/frontier_proto.h"
#include "proto/grpc_server.h"
#include "proto/grpc_util.h"
#include "proto/prefix_cache_stats.h"
#include "transport/session_acceptor.h"

namespace scd::consumer {

namespace {

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{8} << 30;
}

// Admission's settings: --kv-cache-mb, or room for `capacity` sequences of the model's whole
// context within half the machine's memory.
Admission::Options AdmissionOptions(const ConsumerNodeOptions& options, const LlamaModel& model) {
  const int64_t per_token =
      model.config().KvBytesPerToken(static_cast<int64_t>(c10::elementSize(model.dtype())));
  Admission::Options admission;
  admission.capacity = options.capacity;
  admission.max_queued = options.max_queued;
  admission.budget_bytes = std::llround(options.kv_cache_mb * (1 << 20));
  if (admission.budget_bytes == 0) {
    admission.budget_bytes = std::min<int64_t>(
        int64_t{options.capacity} * model.config().max_position_embeddings * per_token,
        PhysicalMemoryBytes() / 2);
  }
  return admission;
}

// The calibrated KL per mode an artifact's fit measured (Artifact::fidelity_json: {"scd": {"kl":
// ..}, ...}), as gauges.
void SetArtifactGauges(MetricsRegistry* metrics, const std::string& id, const Artifact& artifact) {
  const nlohmann::json fidelity = nlohmann::json::parse(artifact.fidelity_json, nullptr, false);
  if (!fidelity.is_object()) return;
  for (const auto& [mode, measured] : fidelity.items()) {
    if (!measured.is_object() || !measured.contains("kl") || !measured["kl"].is_number()) continue;
    metrics
        ->GetGauge("scd:artifact_calibrated_kl",
                   "KL(producer-served || consumer's own) per token the artifact's fit measured "
                   "on held-out text, per mode",
                   {{"artifact", id}, {"producer", artifact.producer.name}, {"mode", mode}})
        .Set(measured["kl"].get<double>());
  }
}

}  // namespace

void ConsumerNode::SetUpMetrics(ConsumerNode* node) {
  for (const auto& [id, artifact] : node->artifacts_) {
    SetArtifactGauges(node->metrics_.get(), id, artifact);
  }
  MetricsRegistry* metrics = node->metrics_.get();
  ConsumerControlService* control = node->control_.get();
  AddNodeStatsCollector(metrics, [control](v1::NodeStats* stats) { control->FillStats(stats); });
  Admission* admission = node->admission_.get();
  node->http_ = std::make_shared<MetricsHttpHandler>(
      metrics, [admission] { return admission->draining() ? "draining" : "serving"; });
}

absl::Status ConsumerNode::LoadArtifacts(const ConsumerNodeOptions& options, ConsumerNode* node,
                                         v1::RegisterRequest* registration,
                                         std::map<std::string, const Artifact*>* held) {
  const std::string precision = PrecisionName(node->model_->precision());
  for (const std::string& path : options.artifacts) {
    SCD_ASSIGN_OR_RETURN(Artifact artifact, Artifact::Load(path));
    if (artifact.consumer.fingerprint != node->fingerprint_) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", path, " was fitted for consumer ", artifact.consumer.name, " (",
                       artifact.consumer.fingerprint.substr(0, 12), "), not ", node->name_, " (",
                       node->fingerprint_.substr(0, 12), ")"));
    }
    if (const PrecisionMeasurement* m = artifact.MeasuredAt(precision);
        m != nullptr && artifact.consumer.precision != precision) {
      spdlog::info("artifact {}: fitted at {} weights, measured at {} (this node): scd KL {:.4g} at "
                   "{:.0f} bytes per token on {} windows of {}",
                   path, artifact.consumer.precision, precision, m->kl, m->bytes_per_token,
                   m->windows, m->data);
    }
    if (const absl::Status p = CheckConsumerPrecision(artifact, precision); !p.ok()) {
      if (!options.allow_precision_mismatch) {
        return absl::FailedPreconditionError(absl::StrCat(path, ": ", p.message(),
                                                          " (or --allow-precision-mismatch)"));
      }
      spdlog::warn("{}: {} (served: --allow-precision-mismatch)", path, std::string(p.message()));
    }
    SCD_ASSIGN_OR_RETURN(std::string id, ArtifactFileId(path));
    v1::ArtifactEntry* entry = registration->add_artifacts();
    entry->set_id(id);
    entry->set_producer_fingerprint(artifact.producer.fingerprint);
    entry->set_consumer_fingerprint(artifact.consumer.fingerprint);
    FrontierToEntry(artifact.frontier, entry);  // the coordinator chooses scd's point from it
    node->artifacts_[id] = std::move(artifact);
    (*held)[id] = &node->artifacts_[id];
    spdlog::info("artifact {} ({} -> {}) from {}", id, node->artifacts_[id].producer.name,
                 node->name_, path);
  }
  return absl::OkStatus();
}

void ConsumerNode::Register(const ConsumerNodeOptions& options, v1::RegisterRequest registration,
                            int64_t kv_budget_bytes, int64_t kv_bytes_per_token,
                            ClusterSecret secret, ConsumerNode* node) {
  SetNodeIdentity(v1::NODE_ROLE_CONSUMER,
                  AdvertisedAddress(node->control_address(), options.advertise), node->name_,
                  node->fingerprint_, &registration);
  registration.set_public_address(AdvertisedAddress(node->address(), options.advertise));
  registration.set_transfer_address(AdvertisedAddress(node->transfer_address(), options.advertise));
  registration.add_transports(options.transport);
  registration.set_capacity(options.capacity);
  registration.set_kv_budget_bytes(static_cast<uint64_t>(kv_budget_bytes));
  registration.set_kv_bytes_per_token(static_cast<uint64_t>(kv_bytes_per_token));
  if (node->tokenizer_ != nullptr) {
    registration.set_tokenizer_fingerprint(node->tokenizer_->fingerprint());
  }
  Admission* admission_ptr = node->admission_.get();
  RegistryClient::PrefixBlocksFn prefix_blocks;
  if (ConsumerPrefixCache* cache = node->prefix_cache_.get(); cache != nullptr) {
    prefix_blocks = [cache] { return PrefixBlocksReport(cache->blocks()); };
  }
  node->registration_ = std::make_unique<RegistryClient>(
      options.coordinator, registration,
      [admission_ptr, speeds = &node->speeds_,
       scheduler = node->scheduler_.get()](v1::HeartbeatRequest* beat) {
        beat->set_active_requests(admission_ptr->active());
        *beat->mutable_speeds() = speeds->Report();
        const DecodeScheduler::Stats steps = scheduler->stats();
        SetPerTokenCost(steps.local_itl_us_per_token, beat->mutable_speeds()->mutable_local_itl());
        SetPerTokenCost(steps.rebuild_itl_us_per_token,
                        beat->mutable_speeds()->mutable_rebuild_itl());
        SetPerTokenCost(steps.busy_prefill_us_per_token,
                        beat->mutable_speeds()->mutable_busy_prefill());
        beat->set_decoding_sequences(static_cast<uint32_t>(steps.decoding));
        beat->set_kv_reserved_bytes(static_cast<uint64_t>(admission_ptr->reserved_bytes()));
        beat->set_queued_requests(admission_ptr->queued());
        beat->set_kv_queued_bytes(static_cast<uint64_t>(admission_ptr->queued_bytes()));
      },
      secret, prefix_blocks);
  node->registration_->Start();
}

ConsumerModel ConsumerNode::ServingModel(const ConsumerNodeOptions& options, ConsumerNode* node) {
  ConsumerModel model{node->model_.get(), node->tokenizer_.get(),     node->name_,
                      TransferOptions(),  options.default_max_tokens, absl::Seconds(60)};
  model.metrics = node->serving_metrics_.get();
  SchedulerOptions scheduling;
  scheduling.max_batched_tokens = options.max_batched_tokens;
  scheduling.nice = options.scheduler_nice;
  scheduling.metrics = node->serving_metrics_.get();
  node->scheduler_ = std::make_unique<DecodeScheduler>(*node->model_, scheduling);
  model.scheduler = node->scheduler_.get();
  node->steps_ = std::make_unique<WorkQueue>(std::max(1, options.step_threads));
  model.steps = node->steps_.get();
  model.transfer_timeout = options.transfer_timeout;
  if (options.prefix_cache_mb > 0) {
    node->prefix_cache_ = std::make_unique<ConsumerPrefixCache>(
        *node->model_, node->fingerprint_, static_cast<int64_t>(options.prefix_cache_mb) << 20);
    model.prefix_cache = node->prefix_cache_.get();
  }
  return model;
}

absl::StatusOr<std::unique_ptr<ConsumerNode>> ConsumerNode::Start(
    const ConsumerNodeOptions& options) {
  SCD_RETURN_IF_ERROR(CheckRegistryAddress(options.coordinator));
  if (!options.advertise.empty()) SCD_RETURN_IF_ERROR(CheckHost(options.advertise, "--advertise"));
  SCD_ASSIGN_OR_RETURN(ClusterSecret secret, ClusterSecret::Of(options.cluster_secret));
  std::unique_ptr<ConsumerNode> node(new ConsumerNode());
  // Health probes on both ports see NOT_SERVING while the model and artifacts load.
  SCD_ASSIGN_OR_RETURN(node->public_, StartLoadingServer(options.listen));
  SCD_ASSIGN_OR_RETURN(node->control_server_, StartLoadingServer(options.control_listen));
  SCD_ASSIGN_OR_RETURN(ServedModel served, LoadServedModel(options.model));
  node->name_ = std::move(served.name);
  node->fingerprint_ = std::move(served.fingerprint);
  node->model_ = std::move(served.model);
  node->tokenizer_ = std::move(served.tokenizer);
  v1::RegisterRequest registration;
  std::map<std::string, const Artifact*> held;
  SCD_RETURN_IF_ERROR(LoadArtifacts(options, node.get(), &registration, &held));
  if (options.capacity == 0) return absl::InvalidArgumentError("--capacity must be at least 1");
  if (options.max_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-batched-tokens must be at least 1");
  }
  const Admission::Options admission = AdmissionOptions(options, *node->model_);
  const int64_t kv_bytes_per_token = node->model_->config().KvBytesPerToken(
      static_cast<int64_t>(c10::elementSize(node->model_->dtype())));
  node->admission_ = Admission::Create(admission);
  spdlog::info("consumer {}: KV memory {:.2f} MiB ({} bytes per position: {} positions), "
               "capacity {} requests, queue {}, {} rows per step",
               node->name_, static_cast<double>(admission.budget_bytes) / (1 << 20),
               kv_bytes_per_token, admission.budget_bytes / kv_bytes_per_token, options.capacity,
               options.max_queued, options.max_batched_tokens);
  transport::TransportOptions transport_options;
  transport_options.backend = options.transport;
  SCD_ASSIGN_OR_RETURN(node->transport_, transport::CreateTransport(transport_options));
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<transport::Listener> listener,
                       node->transport_->Listen(options.transfer_listen));
  transport::ConnectionOptions receive_options;
  receive_options.expected_consumer_fingerprint = node->fingerprint_;
  node->router_ = std::make_unique<SessionRouter>(
      std::make_unique<transport::SessionAcceptor>(std::move(listener), receive_options));

  node->metrics_ = std::make_unique<MetricsRegistry>(
      MetricLabels{{"role", "consumer"}, {"model", node->name_}});
  node->serving_metrics_ = std::make_unique<ServingMetrics>(
      node->metrics_.get(), static_cast<uint64_t>(node->model_->config().KvBytesPerToken(2)));
  node->serving_metrics_->set_speed_tracker(&node->speeds_);
  const ConsumerModel model = ServingModel(options, node.get());
  node->control_ = std::make_unique<ConsumerControlService>(model, held, node->admission_,
                                                            node->router_.get(), secret);
  node->inference_ = std::make_unique<ConsumerInferenceService>(
      model, node->fingerprint_, node->admission_, node->control_->tally());
  PublicApiGuards guards = options.guards;
  guards.tokenizer = node->tokenizer_.get();
  node->checked_ = std::make_unique<CheckedInferenceService>(
      node->inference_.get(), options.limits, /*require_target=*/false, node->control_->tally(),
      node->serving_metrics_.get(), guards);
  SetUpMetrics(node.get());
  SCD_ASSIGN_OR_RETURN(node->control_server_,
                       ServeAfterLoading(&node->control_server_, {node->control_.get()},
                                         {v1::Consumer::service_full_name()}));
  SCD_ASSIGN_OR_RETURN(node->public_, ServeAfterLoading(&node->public_, {node->checked_.get()},
                                                        {v1::Inference::service_full_name()},
                                                        options.max_message_bytes));
  spdlog::info("consumer {} serving the public API on {}, control on {}, transfers on {} ({})",
               node->name_, node->address(), node->control_address(), node->transfer_address(),
               options.transport);

  if (!options.coordinator.empty()) {
    Register(options, std::move(registration), admission.budget_bytes, kv_bytes_per_token,
             std::move(secret), node.get());
  }
  node->public_.health->SetServing(true);
  node->control_server_.health->SetServing(true);
  return node;
}

std::shared_ptr<grpc::Channel> ConsumerNode::InProcessControlChannel() const {
  return control_server_.server->InProcessChannel(grpc::ChannelArguments());
}

void ConsumerNode::Drain() {
  if (public_.health) public_.health->SetServing(false);
  if (control_server_.health) control_server_.health->SetServing(false);
  if (admission_ == nullptr) return;  // Start failed before it made one (a port in use)
  admission_->Drain();
  if (registration_) registration_->Stop();
}

void ConsumerNode::Shutdown(absl::Duration grace) {
  Drain();
  if (admission_ != nullptr && !admission_->AwaitIdle(Clock::Real()->Now() + grace)) {
    spdlog::warn("consumer {}: {} requests still running after the drain grace", name_,
                 admission_->active());
  }
  public_.Shutdown(absl::Now() + absl::Seconds(1));
  control_server_.Shutdown(absl::Now() + absl::Seconds(1));
}

ConsumerNode::~ConsumerNode() {
  if (public_.server) Shutdown(absl::ZeroDuration());
}

}  // namespace scd::consumer
