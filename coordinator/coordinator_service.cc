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
#include "proto/checked_inference.h"
#include "proto/frontier_proto.h"
#include "proto/grpc_util.h"
#include "proto/registry_client.h"
#include "proto/request_validation.h"
#include "tokenizer/prompt_ids.h"

namespace scd::coordinator {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Time t) { return absl::ToChronoTime(t); }

// Output positions routing assumes for a request without max_tokens (the consumers' default).
constexpr int64_t kAssumedMaxTokens = 128;

// How long telling a consumer that its transfer failed may take (a unary call on its control
// plane; the grace period still bounds the wait for its fallback).
constexpr absl::Duration kTellTimeout = absl::Seconds(1);

// One target's Decode call on its consumer, read by its own thread.
struct TargetCall {
  RouteTarget route;
  size_t index = 0;  // in the route's targets
  grpc::ClientContext context;
  std::thread reader;
  // Guarded by the run's mutex.
  bool started = false, ended = false, terminal = false, first_token = false;
  uint32_t consumer_cached_tokens = 0;  // its Started said (the producer sends the rest)
  bool fell_back = false;               // the consumer announced its fallback to its own prefill
  std::string started_mode;
  std::string failure;  // why the coordinator gave up on it (for the Error it writes)
  grpc::Status status;  // how the Decode call ended (once `ended`)
};

}  // namespace

RegistryService::RegistryService(NodeRegistry* registry, ClusterSecret secret,
                                 const Tally* counters)
    : registry_(registry), secret_(std::move(secret)), counters_(counters) {
  sweeper_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (
        !mu_.AwaitWithTimeout(absl::Condition(&stopping_), registry_->options().sweep_interval)) {
      for (const std::string& node : registry_->ExpireLapsed()) {
        spdlog::warn("registry: dropped {}: no heartbeat within the lease", node);
      }
    }
  });
}

RegistryService::~RegistryService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sweeper_.join();
}

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

grpc::Status RegistryService::Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                                    v1::NodeStats* stats) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  FillStats(stats);
  return grpc::Status::OK;
}

void RegistryService::FillStats(v1::NodeStats* stats) const {
  stats->set_role("coordinator");
  stats->set_running(static_cast<uint32_t>(registry_->size()));
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
      auto stub =
          v1::Producer::NewStub(grpc::CreateChannel(row->address(), GrpcChannelCredentials()));
      grpc::ClientContext call;
      secret_.Attach(&call);
      call.set_deadline(Deadline(absl::Now() + absl::Seconds(5)));
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
    : registry_(registry), secret_(std::move(secret)), counters_(counters), options_(options) {}

std::shared_ptr<grpc::Channel> CoordinatorInferenceService::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = grpc::CreateChannel(address, GrpcChannelCredentials());
  }
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
  v1::TransferFailedRequest told;
  told.set_session_id(session_id);
  told.set_target(target.target);
  told.set_reason(reason);
  grpc::ClientContext context;
  secret_.Attach(&context);
  context.set_deadline(Deadline(absl::Now() + kTellTimeout));
  v1::TransferFailedResponse response;
  const grpc::Status status = v1::Consumer::NewStub(Channel(target.consumer_address))
                                  ->TransferFailed(&context, told, &response);
  if (!status.ok()) {
    // An older consumer, or one gone: the grace period below decides as before.
    spdlog::warn("[{}] could not tell {} its transfer failed: {}", id, target.target,
                 ForLog(status.error_message(), 200));
    return;
  }
  spdlog::info("[{}] told {} its transfer failed ({})", id, target.target,
               v1::TransferFailedResponse::Found_Name(response.found()));
}

grpc::Status CoordinatorInferenceService::Generate(grpc::ServerContext* context,
                                                   const v1::GenerateRequest* request,
                                                   grpc::ServerWriter<v1::GenerateEvent>* writer) {
  v1::GenerateRequest req = *request;
  if (req.request_id().empty()) req.set_request_id(RandomId128());
  const std::string session_id = RandomId128();
  const std::string id = ForLog(req.request_id(), 40);  // for logs
  // The prompt's prefix blocks, for cache-aware routing (text only with the tokenizer), and the
  // positions its cache will hold, for routing on the consumers' free KV memory.
  PrefixHint hint;
  {
    absl::StatusOr<std::vector<TokenId>> ids = PromptTokenIds(
        options_.tokenizer, req.prompt(),
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
  }
  const PrefixHint* hint_ptr = &hint;
  absl::StatusOr<Route> route =
      registry_->Resolve(std::vector<std::string>(req.targets().begin(), req.targets().end()),
                         req.mode(), hint_ptr, req.max_kl(), req.ttft_slo_ms());
  if (!route.ok()) {
    spdlog::info("[{}] not routed: {}", id, ForLog(route.status().ToString(), 300));
    CountRefusal(counters_, route.status());
    return ToGrpcStatus(route.status());
  }
  const absl::Time routed_at = absl::Now();  // where the predictions' clocks start
  counters_->Add("routed");
  registry_->NoteRouted(*route, hint_ptr);
  ++active_;
  const absl::Time deadline =
      absl::Now() +
      (req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms()) : options_.default_deadline);
  absl::Mutex mu;              // guards the calls' flags, the producer's timings and the writer
  bool prefill_known = false;  // the producer answered (or there is no producer call)
  uint64_t prefill_us = 0, encode_us = 0;
  uint32_t producer_cached_tokens = 0;  // the producer's answer: positions its cache served
  std::optional<v1::LinkShape> link;    // the shape the producer's sessions travelled under
  std::vector<std::unique_ptr<TargetCall>> calls;
  for (const RouteTarget& target : route->targets) {
    auto call = std::make_unique<TargetCall>();
    call->route = target;
    call->index = calls.size();
    call->context.set_deadline(Deadline(deadline));
    calls.push_back(std::move(call));
  }
  ServingMetrics::Call metrics(options_.metrics);
  auto write_locked = [&](const v1::GenerateEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    metrics.Observe(event);
    writer->Write(event);
  };
  // The Error a target gets when its Decode call ended without a terminal event.
  auto end_without_terminal = [&](TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    call->terminal = true;
    const grpc::Status& status = call->status;
    v1::GenerateEvent error;
    error.set_target(call->route.target);
    const bool quiet = status.ok() || status.error_code() == grpc::StatusCode::CANCELLED;
    error.mutable_error()->set_code(quiet && !call->failure.empty()
                                        ? static_cast<int>(grpc::StatusCode::UNAVAILABLE)
                                        : static_cast<int>(status.error_code()));
    error.mutable_error()->set_message(
        !call->failure.empty()
            ? call->failure
            : absl::StrCat("consumer ", call->route.target, " at ", call->route.consumer_address,
                           ": ", status.ok() ? "ended without a result" : status.error_message()));
    write_locked(error);
  };
  for (auto& owned : calls) {
    TargetCall* call = owned.get();
    v1::DecodeRequest decode;
    *decode.mutable_request() = req;
    decode.set_target(call->route.target);
    decode.set_mode(call->route.mode);
    decode.set_mode_reason(call->route.mode_reason);
    decode.set_producer(route->producer_name);
    decode.set_producer_fingerprint(route->producer_fingerprint);
    decode.set_artifact_id(call->route.artifact_id);
    decode.set_session_id(session_id);
    if (call->route.point) {
      *decode.mutable_point() = CodePointToProto(*call->route.point);
      decode.set_expected_kl(call->route.point->kl);
    }
    secret_.Attach(&call->context);
    auto stub = v1::Consumer::NewStub(Channel(call->route.consumer_address));
    call->reader = std::thread([&, call, decode, stub = std::move(stub)] {
      auto reader = stub->Decode(&call->context, decode);
      v1::GenerateEvent event;
      while (reader->Read(&event)) {
        event.set_target(call->route.target);
        absl::MutexLock lock(&mu);
        if (event.has_finished() && event.finished().mode() != "local" &&
            call->started_mode != "local") {
          // The producer's side of the breakdown: its Prefill answer normally precedes the
          // consumer's Finished (it returns at the transfer's ack).
          mu.AwaitWithTimeout(absl::Condition(&prefill_known), absl::Seconds(2));
          event.mutable_finished()->mutable_timings()->set_prefill(prefill_us);
          event.mutable_finished()->mutable_timings()->set_encode(encode_us);
          if (link.has_value()) *event.mutable_finished()->mutable_link() = *link;
          event.mutable_finished()->set_producer_cached_tokens(producer_cached_tokens);
        }
        if (event.has_started() && call->started) {
          // The consumer fell back to its own prefill (control.proto): noted, not forwarded.
          call->fell_back = true;
          continue;
        }
        if (event.has_started()) {
          call->started = true;
          call->started_mode = event.started().mode();
          call->consumer_cached_tokens = event.started().consumer_cached_tokens();
          if (call->started_mode != "local") {
            event.mutable_started()->set_producer_cached_tokens(route->producer_cached_tokens);
          }
        }
        if (event.has_finished()) {
          v1::Finished* finished = event.mutable_finished();
          // Auto's prediction, where the mode it predicted for is the one that ran.
          if (call->route.predicted_ttft_us > 0 && finished->mode() == call->route.mode) {
            finished->set_predicted_ttft_us(static_cast<uint64_t>(call->route.predicted_ttft_us));
          }
          registry_->ObserveFinished(*route, call->route, *finished);
        }
        if (event.has_token() && !call->first_token) {
          call->first_token = true;
          registry_->NoteFirstToken(*route, call->index);  // its prefill no longer runs
        }
        if (event.has_finished() || event.has_error()) call->terminal = true;
        write_locked(event);
      }
      const grpc::Status status = reader->Finish();
      absl::MutexLock lock(&mu);
      call->ended = true;
      call->status = status;
      // Refused before starting: the main thread decides (the whole call's status, or an Error).
      if (call->terminal || !call->started) return;
      end_without_terminal(call);
    });
  }

  // Waits until `done` holds for every call, cancelling them all if the client goes away.
  auto wait_all = [&](auto done) {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      for (auto& call : calls) {
        if (!done(*call)) return false;
      }
      return true;
    };
    while (!mu.AwaitWithTimeout(absl::Condition(&all), absl::Milliseconds(20))) {
      if (context->IsCancelled()) {
        for (auto& call : calls) call->context.TryCancel();
      }
    }
  };
  wait_all([](const TargetCall& c) { return c.started || c.ended; });
  // Every target refused before starting (its consumer's own checks, full, gone): the request is
  // refused as a whole, with the first refusal's status and no event.
  std::optional<grpc::Status> refused;
  {
    absl::MutexLock lock(&mu);
    if (std::none_of(calls.begin(), calls.end(), [](const auto& c) { return c->started; })) {
      refused = calls.front()->status;
      if (refused->ok()) {
        refused = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               absl::StrCat("consumer ", calls.front()->route.target,
                                            " ended the request without starting it"));
      }
      for (auto& call : calls) call->terminal = true;
    } else {
      for (auto& call : calls) {
        if (call->ended && !call->terminal) end_without_terminal(call.get());
      }
    }
  }
  if (refused.has_value()) {
    for (auto& call : calls) call->reader.join();
    registry_->RoutedDone(*route);
    --active_;
    CountRefusal(counters_, FromGrpcStatus(*refused));
    spdlog::info("[{}] refused by the consumers: {}", id, ForLog(refused->error_message(), 300));
    return *refused;
  }

  // Every target admitted (or gone): one prefill for those that take codes.
  v1::PrefillRequest prefill;
  *prefill.mutable_request() = req;
  prefill.set_session_id(session_id);
  std::map<std::string, TargetCall*> by_target;
  {
    absl::MutexLock lock(&mu);
    for (auto& call : calls) {
      if (!call->started || call->ended || call->fell_back || call->started_mode == "local") {
        continue;
      }
      v1::PrefillTarget* target = prefill.add_targets();
      target->set_target(call->route.target);
      target->set_transfer_address(call->route.transfer_address);
      target->set_consumer_fingerprint(call->route.consumer_fingerprint);
      target->set_mode(call->started_mode);
      target->set_artifact_id(call->route.artifact_id);
      target->set_consumer_cached_tokens(call->consumer_cached_tokens);
      if (call->route.point) *target->mutable_point() = CodePointToProto(*call->route.point);
      if (call->route.deliver_by_us > 0 && !req.keep_ranks()) {
        // The codes' delivery deadline, from now: what the choice's prediction left of it.
        const double left_us =
            call->route.deliver_by_us - absl::ToDoubleMicroseconds(absl::Now() - routed_at);
        target->set_adapt_within_us(static_cast<uint64_t>(std::max(1.0, left_us)));
        target->set_planned_goodput_bytes_per_s(call->route.planned_goodput_bytes_per_s);
      }
      by_target[call->route.target] = call.get();
    }
  }
  if (by_target.empty()) {
    absl::MutexLock lock(&mu);
    prefill_known = true;
  } else {
    // A child of the client's call: a client that goes away cancels the prefill (and so every
    // session it streams) while it runs, not after.
    std::unique_ptr<grpc::ClientContext> prefill_context =
        grpc::ClientContext::FromServerContext(*context);
    prefill_context->set_deadline(Deadline(deadline));
    secret_.Attach(prefill_context.get());
    v1::PrefillResponse response;
    auto producer = v1::Producer::NewStub(Channel(route->producer_address));
    const grpc::Status status = producer->Prefill(prefill_context.get(), prefill, &response);
    std::vector<TargetCall*> failed;
    {
      absl::MutexLock lock(&mu);
      prefill_known = true;
      prefill_us = response.prefill_us();
      encode_us = response.encode_us();
      producer_cached_tokens = response.cached_tokens();
      if (response.has_link()) link = response.link();
      if (!status.ok()) {
        for (auto& [name, call] : by_target) {
          call->failure =
              absl::StrCat("producer ", route->producer_name, " at ", route->producer_address,
                           " failed: ", status.error_message());
          failed.push_back(call);
        }
      } else {
        for (const v1::PrefillOutcome& outcome : response.outcomes()) {
          auto it = by_target.find(outcome.target());
          if (outcome.code() == 0 || it == by_target.end()) continue;
          it->second->failure =
              absl::StrCat("producer ", route->producer_name, ": ", outcome.message());
          failed.push_back(it->second);
        }
      }
    }
    spdlog::info("[{}] prefill on {}: {} ({} us, {} targets failed)", id, route->producer_name,
                 status.ok() ? "ok" : ForLog(status.error_message(), 300), response.prefill_us(),
                 failed.size());
    // A failed target's consumer ends by itself once its session ended (peer lost within the
    // liveness limit); one whose session never reached it cannot tell a dead producer from a slow
    // one, so it is told (Consumer.TransferFailed). Without a fallback the request is over either
    // way: cancel at once. With one, give the consumer the grace period to announce that it fell
    // back to its own prefill; after that it runs to its end (its local prefill and decode may
    // take longer than any grace).
    const bool fall_back = req.allow_local_fallback() && !context->IsCancelled();
    if (fall_back) {
      for (TargetCall* call : failed) {
        std::string reason;
        {
          absl::MutexLock lock(&mu);
          if (call->ended || call->fell_back) continue;  // settled by itself
          reason = call->failure;
        }
        TellTransferFailed(call->route, session_id, reason, id);
      }
    }
    const absl::Time grace_end =
        absl::Now() + (fall_back ? options_.failed_target_grace : absl::ZeroDuration());
    for (TargetCall* call : failed) {
      absl::MutexLock lock(&mu);
      auto settled = [call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return call->ended || call->fell_back;
      };
      mu.AwaitWithDeadline(absl::Condition(&settled), grace_end);
      if (!settled()) call->context.TryCancel();
    }
  }
  wait_all([](const TargetCall& c) { return c.ended; });
  for (auto& call : calls) call->reader.join();
  registry_->RoutedDone(*route);
  --active_;
  spdlog::info("[{}] done ({} targets)", id, calls.size());
  return grpc::Status::OK;
}

grpc::Status CoordinatorInferenceService::ListModels(grpc::ServerContext*,
                                                     const v1::ListModelsRequest*,
                                                     v1::ListModelsResponse* response) {
  for (v1::ModelInfo& model : registry_->Models()) *response->add_models() = std::move(model);
  return grpc::Status::OK;
}

grpc::Status CoordinatorInferenceService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                                 v1::HealthResponse* response) {
  response->set_status("serving");
  response->set_role("coordinator");
  response->set_active_requests(active_.load());
  return grpc::Status::OK;
}

}  // namespace scd::coordinator
