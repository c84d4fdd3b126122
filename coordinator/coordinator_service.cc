#include "coordinator/coordinator_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/grpc_tls.h"
#include "base/log_text.h"
#include "base/prefix_hash.h"
#include "base/random_id.h"
#include "base/release_clock.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "codec/transfer_mode.h"
#include "coordinator/node_ejection.h"
#include "coordinator/resume_token.h"
#include "coordinator/routed_request.h"
#include "proto/frontier_proto.h"
#include "proto/grpc_util.h"
#include "proto/registry_client.h"
#include "proto/request_validation.h"
#include "proto/wire_mode.h"
#include "serving/checked_inference.h"
#include "serving/stats_wait.h"
#include "tokenizer/prompt_ids.h"

namespace scd::coordinator {
namespace {

// Output positions routing assumes for a request without max_tokens (the consumers' default).
constexpr int64_t kAssumedMaxTokens = 128;

// How long telling a consumer that its transfer failed may take (a unary call on its control
// plane; the grace period still bounds the wait for its fallback).
constexpr absl::Duration kTellTimeout = absl::Seconds(1);

// The prompt's prefix blocks, for cache-aware routing (text only with the tokenizer), and the
// positions its cache will hold, for routing on the consumers' free KV memory.
PrefixHint HintFor(const Tokenizer* tokenizer, const v1::GenerateRequest& req) {
  PrefixHint hint;
  absl::StatusOr<std::vector<TokenId>> ids = PromptTokenIds(
      tokenizer, req.prompt(),
      absl::MakeConstSpan(req.prompt_ids().data(), static_cast<size_t>(req.prompt_ids_size())),
      int64_t{1} << 31, int64_t{1} << 31);
  // Without a tokenizer a text prompt's length is estimated (auto's cost model): ~4 bytes a
  // token, as English text runs under the Llama tokenizers.
  hint.prompt_tokens = ids.ok() ? static_cast<int64_t>(ids->size())
                                : (static_cast<int64_t>(req.prompt().size()) + 3) / 4;
  hint.kv_positions =
      static_cast<int64_t>(req.max_tokens() > 0 ? req.max_tokens() : kAssumedMaxTokens) +
      (ids.ok() ? static_cast<int64_t>(ids->size()) : 0);
  if (ids.ok() && ids->size() > 1) {
    hint.block_tokens = kPrefixBlockTokens;
    hint.blocks = RoutingKeys(PrefixBlockChain(
        req.cache_salt(), absl::MakeConstSpan(*ids).first(ids->size() - 1), kPrefixBlockTokens));
  }
  return hint;
}

// A resumed stream that had every token it may have (max_tokens) but not its Finished: nothing is
// left to generate (a consumer refuses such a continuation), so the coordinator ends it itself:
// the resume's Moved, then the Finished RoutedRequest writes for a consumer lost after its last
// token. `req`: narrowed to its one target.
EventStream* FinishedResume(const v1::GenerateRequest& req, size_t received, TransferMode mode,
                            EventStream::Ended ended) {
  auto* stream = new EventStream(4, std::move(ended));
  v1::GenerateEvent moved;
  moved.set_target(req.targets(0));
  moved.mutable_moved()->set_tokens_so_far(static_cast<uint32_t>(received));
  moved.mutable_moved()->set_resumed(true);
  moved.mutable_moved()->set_reason(
      "resumed through this coordinator after its last token: nothing left to generate");
  stream->Push(std::move(moved));
  stream->Push(FinishedAfterLastToken(
      req, req.targets(0), received, mode, 0,
      "the client's coordinator went away after the last token (max_tokens), before the Finished"));
  stream->End(grpc::Status::OK);
  return stream;
}

}  // namespace

RegistryService::RegistryService(NodeRegistry* registry, ClusterSecret secret,
                                 const Tally* counters)
    : registry_(registry),
      secret_(std::move(secret)),
      counters_(counters),
      sweeper_(registry->clock(), registry->options().sweep_interval, [registry] {
        for (const std::string& node : registry->ExpireLapsed()) {
          spdlog::warn("registry: dropped {}: no heartbeat within the lease", node);
        }
      }) {}

RegistryService::~RegistryService() = default;

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const v1::RegisterRequest* request,
                                       v1::RegisterResponse* response) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  absl::StatusOr<Lease> lease = registry_->Register(*request);
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  response->set_node_id(lease->node_id);
  response->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(lease->lease)));
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(lease->heartbeat_interval)));
  spdlog::info("registry: {} registered at {} ({} models)", ShortNodeId(lease->node_id),
               ForLog(request->address()), request->models_size());
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse*) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  return ToGrpcStatus(registry_->Heartbeat(*request));
}

grpc::Status RegistryService::Deregister(grpc::ServerContext* context,
                                         const v1::DeregisterRequest* request,
                                         v1::DeregisterResponse*) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  spdlog::info("registry: {} deregisters", ShortNodeId(request->node_id()));
  return ToGrpcStatus(registry_->Deregister(request->node_id()));
}

grpc::Status RegistryService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                    v1::NodeStats* stats) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  const uint64_t change = AwaitStatsChange(*request, *context);
  FillStats(stats);
  stats->set_change_count(change);
  return grpc::Status::OK;
}

void RegistryService::FillStats(v1::NodeStats* stats) const {
  stats->set_role("coordinator");
  stats->set_last_release_unix_micros(LastReleaseUnixMicros());
  stats->set_running(static_cast<uint32_t>(registry_->size()));
  stats->set_nodes_out(registry_->NodesOut());
  const NodeRegistry::EjectionCounts counts = registry_->ejection_counts();
  v1::EjectionStats* ejection = stats->mutable_ejection();
  ejection->set_ejected(counts.ejected);
  ejection->set_returned(counts.returned);
  ejection->set_advice_heard(counts.advice_heard);
  ejection->set_advice_cleared(counts.advice_cleared);
  ejection->set_advice_confirmed(counts.advice_confirmed);
  for (const auto& [name, count] : counters_->Snapshot()) (*stats->mutable_ended())[name] = count;
}

grpc::Status RegistryService::SetLinkShape(grpc::ServerContext* context,
                                           const v1::SetLinkShapeRequest* request,
                                           v1::SetLinkShapeResponse* response) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  if (request->has_shape()) {
    if (absl::Status valid = ValidateLinkShape(request->shape()); !valid.ok()) {
      return ToGrpcStatus(valid);
    }
  }
  const std::vector<NodeRegistry::ProducerNode> producers =
      registry_->Producers(request->producer());
  if (producers.empty()) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        request->producer().empty()
            ? "no live producer"
            : absl::StrCat("no live producer named '", ForLog(request->producer(), 128), "'"));
  }
  // One call per producer, all at once; each answers on its own row.
  std::vector<std::thread> calls;
  for (const NodeRegistry::ProducerNode& producer : producers) {
    v1::ProducerLink* row = response->add_producers();
    row->set_node_id(producer.node_id);
    row->set_name(producer.name);
    row->set_address(producer.control_address);
    calls.emplace_back([this, request, row] {
      NameThisThread("scd-set-shape");
      auto stub = v1::Producer::NewStub(NewGrpcChannel(row->address()));
      grpc::ClientContext call;
      secret_.Attach(&call);
      call.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      const grpc::Status status = stub->SetLinkShape(&call, *request, row->mutable_shape());
      if (!status.ok()) {
        row->clear_shape();
        row->set_code(status.error_code());
        row->set_message(status.error_message());
      }
    });
  }
  for (std::thread& call : calls) call.join();
  for (const v1::ProducerLink& row : response->producers()) {
    if (row.code() == 0 && !request->unannounced()) {
      registry_->NoteLinkShape(row.node_id(), row.shape());
    }
    if (request->has_shape()) {
      spdlog::info("link shape of producer {} ({}): {}", row.name(), ShortNodeId(row.node_id()),
                   row.code() == 0 ? absl::StrCat(row.shape().gbps(), " Gbit/s, ",
                                                  row.shape().latency_us(), " us")
                                   : absl::StrCat("not set: ", ForLog(row.message(), 200)));
    }
  }
  return grpc::Status::OK;
}

CoordinatorInferenceService::CoordinatorInferenceService(NodeRegistry* registry,
                                                         ClusterSecret secret, Tally* counters,
                                                         CoordinatorOptions options)
    : registry_(registry),
      secret_(std::move(secret)),
      counters_(counters),
      options_(options),
      resumes_(ResumeBook::Options{options.max_resumes_per_tenant_per_minute}),
      prober_(std::make_unique<NodeProber>(
          registry, &secret_, [this](const std::string& address) { return Channel(address); })) {}

CoordinatorInferenceService::~CoordinatorInferenceService() { prober_.reset(); }

std::shared_ptr<grpc::Channel> CoordinatorInferenceService::NodeChannel(
    const std::string& address) {
  // Keepalive pings notice a node that stopped answering (coordinator/node_ejection.h), with
  // calls or without; HTTP/2 would otherwise stop pinging after two pings without data.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kNodeKeepalive)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kNodeKeepaliveTimeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return NewGrpcChannel(address, args);
}

std::shared_ptr<grpc::Channel> CoordinatorInferenceService::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) channel = NodeChannel(address);
  return channel;
}

void CoordinatorInferenceService::UseChannel(const std::string& address,
                                             std::shared_ptr<grpc::Channel> channel) {
  absl::MutexLock lock(&mu_);
  channels_[address] = std::move(channel);
}

void CoordinatorInferenceService::TellTransferFailed(const RouteTarget& target,
                                                     const std::string& session_id,
                                                     const std::string& reason,
                                                     const std::string& id) {
  struct Told {
    grpc::ClientContext context;
    std::unique_ptr<v1::Consumer::Stub> stub;
    v1::TransferFailedRequest request;
    v1::TransferFailedResponse response;
  };
  auto told = std::make_shared<Told>();
  told->request.set_session_id(session_id);
  told->request.set_target(target.target);
  told->request.set_reason(reason);
  secret_.Attach(&told->context);
  told->context.set_deadline(absl::ToChronoTime(absl::Now() + kTellTimeout));
  told->stub = v1::Consumer::NewStub(Channel(target.consumer_address));
  told->stub->async()->TransferFailed(
      &told->context, &told->request, &told->response,
      [told, id, name = target.target](grpc::Status status) {
        if (!status.ok()) {
          // An older consumer, or one gone: the grace period decides as before.
          spdlog::warn("[{}] could not tell {} its transfer failed: {}", id, name,
                       ForLog(status.error_message(), 200));
          return;
        }
        spdlog::info("[{}] told {} its transfer failed ({})", id, name,
                     v1::TransferFailedResponse::Found_Name(told->response.found()));
      });
}

absl::StatusOr<CoordinatorInferenceService::Resumed> CoordinatorInferenceService::CheckResume(
    const grpc::CallbackServerContext& context, v1::GenerateRequest* req) {
  const absl::Time now = absl::Now();
  absl::StatusOr<ResumeGrant> grant =
      CheckResumeToken(secret_, *req, PresentedApiToken(context), now);
  if (!grant.ok()) return grant.status();
  // More ids than the request may have: malformed, refused before any work (a Finished would
  // count them as output).
  if (req->max_tokens() > 0 &&
      static_cast<uint64_t>(req->resume_received_ids_size()) > req->max_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_received_ids: ", req->resume_received_ids_size(),
                     " ids, more than max_tokens ", req->max_tokens()));
  }
  SCD_RETURN_IF_ERROR(resumes_.Admit(grant->mac,
                                     static_cast<uint64_t>(req->resume_received_ids_size()),
                                     req->cache_salt(), grant->deadline, now));
  Resumed resumed;
  resumed.received.assign(req->resume_received_ids().begin(), req->resume_received_ids().end());
  resumed.deadline = grant->deadline;
  resumed.mode = grant->mode;
  req->set_request_id(grant->request_id);
  // A fan-out's target resumes alone (its token names it): the call serves that one.
  req->clear_targets();
  req->add_targets(grant->target);
  SetRequestMode(grant->mode, req);
  req->clear_resume_token();
  req->clear_resume_received_ids();
  return resumed;
}

EventStream* CoordinatorInferenceService::Generate(grpc::CallbackServerContext* context,
                                                   v1::GenerateRequest req,
                                                   EventStream::Ended ended) {
  std::optional<Resumed> resumed;
  if (!req.resume_token().empty()) {
    absl::StatusOr<Resumed> checked = CheckResume(*context, &req);
    if (!checked.ok()) {  // the token never reaches a log
      spdlog::info("resume refused: {}", checked.status().ToString());
      CountRefusal(counters_, checked.status());
      return RefusedStream(ToGrpcStatus(checked.status()), std::move(ended));
    }
    resumed = *std::move(checked);
    counters_->Add("resumed");
    if (req.max_tokens() > 0 && resumed->received.size() >= req.max_tokens()) {
      spdlog::info("[{}] resumed after its last token: finished here",
                   ForLog(req.request_id(), 40));
      return FinishedResume(req, resumed->received.size(), resumed->mode, std::move(ended));
    }
  }
  if (req.request_id().empty()) req.set_request_id(RandomId128());
  const std::string id = ForLog(req.request_id(), 40);  // for logs
  const PrefixHint hint = HintFor(options_.tokenizer, req);
  absl::StatusOr<RequestedMode> mode = RequestModeOf(req);  // the enum: read at the edge
  absl::StatusOr<Route> route =
      !mode.ok() ? absl::StatusOr<Route>(mode.status())
                 : registry_->Resolve(
                       std::vector<std::string>(req.targets().begin(), req.targets().end()), *mode,
                       &hint, req.max_kl(), req.ttft_slo_ms(), LocalFallbackAllowed(req));
  if (!route.ok()) {
    spdlog::info("[{}] not routed: {}", id, ForLog(route.status().ToString(), 300));
    CountRefusal(counters_, route.status());
    return RefusedStream(ToGrpcStatus(route.status()), std::move(ended));
  }
  counters_->Add("routed");
  RoutedRequestDeps deps;
  deps.registry = registry_;
  deps.secret = &secret_;
  deps.channel = [this](const std::string& address) { return Channel(address); };
  deps.metrics = options_.metrics;
  deps.active = &active_;
  deps.failed_target_grace = options_.failed_target_grace;
  deps.early_prefill = options_.early_prefill && !resumed.has_value();
  deps.migration_limit = options_.migration_limit;
  deps.tell_failed = [this, id](const RouteTarget& target, const std::string& session_id,
                                const std::string& reason) {
    TellTransferFailed(target, session_id, reason, id);
  };
  // The request's deadline, or the call's own (a client's gRPC deadline) when that is sooner:
  // the targets' calls carry it, so each node ends the request by its own clock at that moment
  // rather than when the coordinator's cancel reaches it.
  // A resumed request keeps its original deadline (the token carries it).
  const absl::Time deadline =
      std::min(resumed.has_value()
                   ? resumed->deadline
                   : absl::Now() + (req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms())
                                                          : options_.default_deadline),
               FromGrpcDeadline(context->deadline()));
  if (!resumed.has_value()) {
    // Signed over the request the RoutedRequest keeps (the same as `req` here, never changed).
    deps.resume_token = [secret = &secret_, api_token = PresentedApiToken(*context), deadline](
                            const v1::GenerateRequest& request, TransferMode started,
                            const std::string& target) {
      return IssueResumeToken(*secret, request, api_token, deadline, started, target);
    };
  }
  // A request refused as a whole by its consumers is counted with the others.
  auto counted = [counters = counters_, ended = std::move(ended)](const grpc::Status& status) {
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      CountRefusal(counters, FromGrpcStatus(status));
    }
    if (ended) ended(status);
  };
  auto* run = new RoutedRequest(std::move(deps), std::move(req), *std::move(route), &hint, deadline,
                                context, std::move(counted));
  if (resumed.has_value()) run->Resume(std::move(resumed->received), resumed->mode);
  run->Start();
  return run;
}

grpc::Status CoordinatorInferenceService::ListModels(v1::ListModelsResponse* response) {
  for (v1::ModelInfo& model : registry_->Models()) *response->add_models() = std::move(model);
  return grpc::Status::OK;
}

grpc::Status CoordinatorInferenceService::Health(v1::HealthResponse* response) {
  response->set_status("serving");
  response->set_role("coordinator");
  response->set_active_requests(active_.load());
  return grpc::Status::OK;
}

}  // namespace scd::coordinator
