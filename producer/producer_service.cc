#include "producer/producer_service.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cancellation.h"
#include "base/change_notice.h"
#include "base/exception_guard.h"
#include "base/log_text.h"
#include "base/release_clock.h"
#include "base/status_macros.h"
#include "codec/code_encoder.h"
#include "codec/transfer_mode.h"
#include "producer/adaptive_sender.h"
#include "producer/prefill_streamer.h"
#include "proto/grpc_util.h"
#include "proto/prefix_cache_stats.h"
#include "proto/request_validation.h"
#include "proto/requested_point.h"
#include "proto/session_tag.h"
#include "proto/wire_mode.h"
#include "serving/stats_wait.h"
#include "tokenizer/prompt_ids.h"

namespace scd::producer {
namespace {

uint64_t Micros(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Microseconds(d)); }

// A target's adaptation budget, checked: at most an hour, a finite goodput of 0 or more.
absl::StatusOr<AdaptBudget> AdaptBudgetOf(const v1::PrefillTarget& target) {
  constexpr uint64_t kMaxUs = uint64_t{3600} * 1000 * 1000;
  const double goodput = target.planned_goodput_bytes_per_s();
  if (target.adapt_within_us() > kMaxUs || !std::isfinite(goodput) || goodput < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        target.target(), ": adapt_within_us ", target.adapt_within_us(),
        " (at most an hour) / planned_goodput_bytes_per_s ", goodput, " (finite, 0 or more)"));
  }
  return AdaptBudget{absl::Microseconds(static_cast<int64_t>(target.adapt_within_us())), goodput};
}

}  // namespace

ProducerControlService::ProducerControlService(ProducerModel producer,
                                               transport::Transport* transport,
                                               ClusterSecret secret,
                                               transport::ConnectionOptions connection_options)
    : producer_(std::move(producer)),
      transport_(transport),
      secret_(std::move(secret)),
      connection_options_(std::move(connection_options)),
      shape_(connection_options_.shape),
      prefill_queue_(producer_.prefill_threads, "scd-prefill") {
  AdaptiveSender::SendingQueue();  // its threads start now, not at the first request
  if (producer_.prefix_cache_bytes > 0) {
    // Every plan this producer may be asked for: what its cached blocks must let it encode.
    std::vector<TransferPlan> plans;
    const ModelConfig& config = producer_.model->config();
    for (TransferMode mode : {TransferMode::kRaw, TransferMode::kInt4, TransferMode::kRecompute,
                              TransferMode::kReuse, TransferMode::kScd}) {
      std::vector<const Artifact*> artifacts;
      if (ModeServedWithArtifact(mode)) {
        for (const auto& [id, artifact] : producer_.artifacts) artifacts.push_back(artifact);
      } else {
        artifacts.push_back(nullptr);
      }
      for (const Artifact* artifact : artifacts) {
        absl::StatusOr<TransferPlan> plan =
            TransferPlan::Make(mode, config, artifact, producer_.transfer_options);
        if (plan.ok()) plans.push_back(*std::move(plan));
      }
    }
    prefix_store_ = std::make_unique<ProducerPrefixStore>(*producer_.model, producer_.fingerprint,
                                                          plans, producer_.prefix_cache_bytes);
  }
}

std::vector<uint64_t> ProducerControlService::CachedBlocks(size_t max) const {
  return prefix_store_ ? prefix_store_->blocks().RoutingKeys(max) : std::vector<uint64_t>{};
}

namespace {

bool SameShape(const transport::LinkShape& a, const transport::LinkShape& b) {
  return a.gbps == b.gbps && a.latency == b.latency && a.burst_bytes == b.burst_bytes &&
         a.reshapable == b.reshapable;
}

}  // namespace

absl::StatusOr<std::shared_ptr<transport::TransferConnection>> ProducerControlService::Connection(
    const std::string& address, transport::LinkShape* shape) {
  std::vector<std::shared_ptr<transport::TransferConnection>> dead;  // freed after the lock
  absl::MutexLock lock(&mu_);
  // Connections whose links are gone go first, with their threads: a consumer that died and came
  // back elsewhere never asks for its old address again, and one at the same address gets a new
  // connection below.
  for (auto c = connections_.begin(); c != connections_.end();) {
    if (c->second.connection->alive()) {
      ++c;
    } else {
      dead.push_back(std::move(c->second.connection));
      c = connections_.erase(c);
    }
  }
  if (!dead.empty()) NoteChange();
  auto it = connections_.find(address);
  if (it != connections_.end() && SameShape(it->second.shape, shape_)) {
    *shape = it->second.shape;
    return it->second.connection;
  }
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<transport::Link> link,
                       transport_->Connect(address, absl::Seconds(5)));
  transport::ConnectionOptions options = connection_options_;
  options.shape = shape_;
  auto connection = transport::TransferConnection::Create(std::move(link), options);
  connections_[address] = {connection, shape_};
  NoteChange();
  *shape = shape_;
  return connection;
}

size_t ProducerControlService::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_.size();
}

size_t ProducerControlService::open_sessions() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& [address, cached] : connections_) open += cached.connection->open_sessions();
  return open;
}

grpc::Status ProducerControlService::SetLinkShape(grpc::ServerContext* context,
                                                  const v1::SetLinkShapeRequest* request,
                                                  v1::LinkShape* shape) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  absl::MutexLock lock(&mu_);
  if (request->has_shape()) {
    if (absl::Status valid = ValidateLinkShape(request->shape()); !valid.ok()) {
      return ToGrpcStatus(valid);
    }
    shape_.gbps = request->shape().gbps();
    shape_.latency = absl::Microseconds(request->shape().latency_us());
    shape_.reshapable = true;  // once shaped, every link may be reshaped under way
    // Transfers under way slow down or speed up at once, as on a real link; a connection opened
    // unshaped cannot be and is replaced at its next session (Connection).
    int reshaped = 0;
    for (auto& [address, cached] : connections_) {
      if (cached.connection->Reshape(shape_).ok()) {
        cached.shape = shape_;
        ++reshaped;
      }
    }
    spdlog::info("link shape set: {} Gbit/s (0: unlimited), {} us; {} open connection(s) reshaped",
                 shape_.gbps, request->shape().latency_us(), reshaped);
  }
  shape->set_gbps(shape_.gbps);
  shape->set_latency_us(absl::ToDoubleMicroseconds(shape_.latency));
  return grpc::Status::OK;
}

grpc::Status ProducerControlService::Stats(grpc::ServerContext* context,
                                           const v1::StatsRequest* request, v1::NodeStats* stats) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  const uint64_t change = AwaitStatsChange(*request, *context);
  FillStats(stats);
  stats->set_change_count(change);
  return grpc::Status::OK;
}

void ProducerControlService::FillStats(v1::NodeStats* stats) const {
  stats->set_role("producer");
  stats->set_last_release_unix_micros(LastReleaseUnixMicros());
  stats->set_running(running_.load());
  stats->set_open_sessions(static_cast<uint32_t>(open_sessions()));
  stats->set_held_payload_bytes(held_payload_bytes_.load());
  stats->set_prefills(prefills_.load());
  stats->set_prefill_tokens(prefill_tokens_.load());
  if (prefix_store_) {
    SetPrefixCacheStats(prefix_store_->blocks().Counters(), stats);
    stats->mutable_prefix_cache()->set_code_hit_tokens(prefix_store_->code_hit_tokens());
  }
  for (const auto& [name, count] : ended_.Snapshot()) (*stats->mutable_ended())[name] = count;
}

// One target's encoder and session, or why it has none.
struct ProducerControlService::OpenTarget {
  std::unique_ptr<CodeEncoder> encoder;
  std::shared_ptr<transport::SendSession> session;
  absl::Status status;
  transport::LinkShape shape;  // the link its session travels on (at its start)
  std::string address;         // the consumer's transfer address
  int64_t begin = 0;           // the first position sent (the consumer holds the rest)
  TransferOptions options;     // the node's, at the target's frontier point when it has one
  AdaptBudget adapt;           // none unless the target asks for adaptation
  int layer_begin = 0;         // a takeover's first layer sent (PrefillTarget.layer_begin)
};

// One Prefill's state: its targets, the prefix cache's part, what the pass reported.
struct ProducerControlService::PrefillRun {
  std::vector<TokenId> prefix;  // the prompt less its last token
  absl::Duration deadline;
  std::vector<OpenTarget> open;                   // per requested target
  std::vector<StreamTarget> streams;              // the targets whose session opened
  std::vector<int> stream_index;                  // each stream's target
  std::optional<ProducerPrefixStore::Keys> keys;  // the prefix's full blocks (cache on)
  CachedPrefix cached;
  std::optional<PrefixBlockCache<ProducerBlock>::Claim> claim;  // what this pass computes
  std::map<int, LayerCapture> keep;
  std::vector<EncodedRun> codes;
  std::optional<PrefixReuse> reuse;  // points into this run: never moved once set
  StreamReport report;
};

// One Prefill call: its cancellation, which gRPC tells (OnCancel); finished by its run.
class ProducerControlService::PrefillCall final : public grpc::ServerUnaryReactor {
 public:
  Cancellation cancellation;

 private:
  void OnCancel() override {
    cancellation.Cancel(absl::CancelledError("the coordinator's call was cancelled"));
  }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* ProducerControlService::Prefill(grpc::CallbackServerContext* context,
                                                          const v1::PrefillRequest* request,
                                                          v1::PrefillResponse* response) {
  auto* call = new PrefillCall;
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) {
    ended_.Add("refused_unauthenticated");
    call->Finish(auth);
    return call;
  }
  prefill_queue_.Run([this, call, request, response] {
    // Cancelled while it waited: nothing was opened yet.
    call->Finish(call->cancellation.cancelled()
                     ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before it ran")
                     : RunPrefill(*request, &call->cancellation, response));
  });
  return call;
}

grpc::Status ProducerControlService::RunPrefill(const v1::PrefillRequest& prefill,
                                                Cancellation* cancel,
                                                v1::PrefillResponse* response) {
  const v1::PrefillRequest* request = &prefill;
  const v1::GenerateRequest& req = request->request();
  const std::string id = ForLog(req.request_id(), 40);  // for logs
  if (request->session_id().empty()) {
    ended_.Add("refused_invalid_argument");
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "session_id: empty (the coordinator sets it)");
  }
  const ModelConfig& config = producer_.model->config();
  absl::StatusOr<std::vector<TokenId>> ids = PromptTokenIds(
      producer_.tokenizer, req.prompt(),
      absl::MakeConstSpan(req.prompt_ids().data(), static_cast<size_t>(req.prompt_ids_size())),
      config.vocab_size, config.max_position_embeddings);
  if (!ids.ok()) {
    ended_.Add("refused_invalid_argument");
    return ToGrpcStatus(ids.status());
  }
  PrefillRun run;
  run.deadline =
      req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms()) : producer_.default_deadline;
  run.prefix.assign(ids->begin(), ids->end() - 1);
  if (prefix_store_ && !run.prefix.empty()) {
    run.keys = prefix_store_->KeysFor(req.cache_salt(), run.prefix);
  }
  // Open every target's session first (the header goes before the first layer exists).
  run.open.resize(static_cast<size_t>(request->targets_size()));
  for (int i = 0; i < request->targets_size() && !run.prefix.empty(); ++i) {
    OpenTarget& o = run.open[static_cast<size_t>(i)];
    o.status = OpenSession(*request, i, run, &o);
    if (!o.status.ok()) continue;
    // The artifact names the encoding only where the mode uses one (raw and int4 ignore it).
    const bool uses_artifact = ModeServedWithArtifact(o.encoder->plan().mode);
    // A takeover's codes skip the first layers: not a whole encoding to keep.
    run.streams.push_back({o.encoder.get(), o.session, o.begin,
                           o.layer_begin > 0
                               ? std::string()
                               : CodesKey(o.encoder->plan(), o.options,
                                          uses_artifact ? request->targets(i).artifact_id() : ""),
                           o.adapt, 0, o.layer_begin});
    run.stream_index.push_back(i);
  }
  if (run.keys.has_value() && !run.streams.empty()) LookUpPrefix(cancel, &run);
  if (!run.streams.empty()) {
    if (absl::Status streamed = Stream(cancel, &run); !streamed.ok()) {
      return ToGrpcStatus(streamed);
    }
  }
  Answer(*request, run, response);
  spdlog::info("[{}] prefill of {} tokens ({} cached) for {} targets: {} us", id, run.prefix.size(),
               run.report.cached_tokens, request->targets_size(), response->prefill_us());
  return grpc::Status::OK;
}

absl::Status ProducerControlService::OpenSession(const v1::PrefillRequest& request, int i,
                                                 const PrefillRun& run, OpenTarget* o) {
  const v1::PrefillTarget& target = request.targets(i);
  const ModelConfig& config = producer_.model->config();
  SCD_ASSIGN_OR_RETURN(TransferMode mode, TargetModeOf(target));
  const Artifact* artifact = nullptr;
  if (ModeServedWithArtifact(mode)) {
    auto it = producer_.artifacts.find(target.artifact_id());
    if (it == producer_.artifacts.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the producer holds no artifact '", target.artifact_id(), "' for ", target.target()));
    }
    artifact = it->second;
  }
  o->options = producer_.transfer_options;
  if (target.has_point()) {
    absl::StatusOr<FrontierPoint> point =
        RequestedPoint(target.point(), mode, artifact, target.artifact_id());
    if (!point.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(target.target(), "'s ", point.status().message()));
    }
    o->options = TransferOptions::AtPoint(*point, producer_.transfer_options);
  }
  SCD_ASSIGN_OR_RETURN(TransferPlan plan, TransferPlan::Make(mode, config, artifact, o->options));
  o->encoder = std::make_unique<CodeEncoder>(plan, artifact, o->options);
  TransferIdentity identity{SessionTag(request.session_id(), target.target()),
                            producer_.fingerprint, target.consumer_fingerprint(),
                            target.artifact_id()};
  const int64_t B = prefix_store_ ? prefix_store_->block_tokens() : kPrefixBlockTokens;
  const int64_t prefix_tokens = static_cast<int64_t>(run.prefix.size());
  o->begin = target.consumer_cached_tokens();
  if (o->begin % B != 0 || o->begin >= prefix_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consumer_cached_tokens ", o->begin, " of ", target.target(), ": not a multiple of the ", B,
        "-position prefix block below the prefix's ", prefix_tokens, " positions"));
  }
  SCD_ASSIGN_OR_RETURN(o->adapt, AdaptBudgetOf(target));
  o->layer_begin = static_cast<int>(std::min<uint32_t>(target.layer_begin(), 1u << 20));
  if (o->layer_begin > 0 && o->adapt.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(target.target(), ": layer_begin ",
                                                   o->layer_begin,
                                                   " with adapt_within_us (a takeover "
                                                   "sends the rest at the plan's ranks)"));
  }
  SCD_ASSIGN_OR_RETURN(v1::TransferHeader header, StreamHeader(*o->encoder, config, prefix_tokens,
                                                               identity, o->begin, o->layer_begin));
  header.set_adaptive(o->adapt.enabled());
  o->address = target.transfer_address();
  SCD_ASSIGN_OR_RETURN(std::shared_ptr<transport::TransferConnection> connection,
                       Connection(o->address, &o->shape));
  SCD_ASSIGN_OR_RETURN(o->session, connection->StartSession(std::move(header), run.deadline));
  return absl::OkStatus();
}

void ProducerControlService::LookUpPrefix(Cancellation* cancel, PrefillRun* run) {
  // The cached part of the prefix (single-flight: when another request is computing the next
  // blocks, wait for it and look again), and the claim on what this request will compute.
  const bool servable =
      std::all_of(run->streams.begin(), run->streams.end(),
                  [&](const StreamTarget& s) { return prefix_store_->Serves(s.encoder->plan()); });
  const size_t full = run->keys->keys.size();
  const absl::Time wait_until = absl::Now() + run->deadline;
  for (;;) {
    run->cached = servable ? prefix_store_->Lookup(*run->keys, full) : CachedPrefix{};
    if (run->cached.blocks.size() >= full) break;
    run->claim = prefix_store_->blocks().ClaimOrWait(run->keys->keys, run->cached.blocks.size(),
                                                     full, wait_until, cancel);
    if (run->claim.has_value() || absl::Now() >= wait_until || cancel->cancelled()) break;
  }
  prefix_store_->Record(run->cached.tokens, static_cast<int64_t>(run->prefix.size()));
  run->reuse = PrefixReuse{prefix_store_.get(), &run->cached, &run->keep, &run->codes};
}

absl::Status ProducerControlService::Stream(Cancellation* cancel, PrefillRun* run) {
  ++running_;
  NoteChange();
  // Running until the pass's blocks and codes are stored: whoever sees none running (a drain, a
  // test, a heartbeat) sees them.
  absl::Cleanup done = [this] {
    --running_;
    NoteRelease();
  };
  std::vector<StreamTarget>& streams = run->streams;
  // The caller going away ends every session, which ends the pass at its next layer.
  const Cancellation::Registration end_sessions = cancel->OnCancel([&streams](const absl::Status&) {
    for (const StreamTarget& stream : streams) {
      stream.session->Cancel("the request was cancelled");
    }
  });
  absl::StatusOr<StreamReport> streamed = GuardExceptions("ProducerControlService::Prefill", [&] {
    return StreamPrefill(*producer_.model, run->prefix, streams, &held_payload_bytes_,
                         run->reuse.has_value() ? &*run->reuse : nullptr);
  });
  for (const StreamTarget& stream : streams) {
    ended_.Add(transport::SessionStateName(stream.session->state()));
  }
  SCD_RETURN_IF_ERROR(streamed.status());
  run->report = *std::move(streamed);
  const StreamReport& report = run->report;
  prefills_.fetch_add(1);
  prefill_tokens_.fetch_add(static_cast<uint64_t>(report.computed_tokens));
  // Only a pass that ran every layer over every position leaves blocks behind.
  if (run->reuse.has_value() && report.forward_complete && report.computed_tokens > 0) {
    prefix_store_->Store(*run->keys, report.cached_tokens, run->keep);
  }
  if (run->reuse.has_value()) {
    // Codes of this prefill's encodings, kept with the blocks they cover (new or cached), so the
    // next hit of the same encoding sends them as they are. Only a complete pass's blocks exist.
    run->keep.clear();  // the activations are in the blocks now
    // One run per encoding: targets sharing one encoded it once; the earliest start covers most.
    std::map<std::string, const EncodedRun*> runs;
    for (const EncodedRun& encoded : run->codes) {
      if (!encoded.complete()) continue;
      auto [it, added] = runs.emplace(encoded.key, &encoded);
      if (!added && encoded.from < it->second->from) it->second = &encoded;
    }
    for (const auto& [key, encoded] : runs) prefix_store_->AddCodes(*run->keys, *encoded);
    prefix_store_->RecordCodeHits(report.code_hit_tokens);
  }
  for (size_t s = 0; s < streams.size(); ++s) {
    run->open[static_cast<size_t>(run->stream_index[s])].status = report.targets[s];
  }
  return absl::OkStatus();
}

void ProducerControlService::Answer(const v1::PrefillRequest& request, const PrefillRun& run,
                                    v1::PrefillResponse* response) {
  for (int i = 0; i < request.targets_size(); ++i) {
    const OpenTarget& o = run.open[static_cast<size_t>(i)];
    v1::PrefillOutcome* outcome = response->add_outcomes();
    outcome->set_target(request.targets(i).target());
    if (run.prefix.empty()) {
      outcome->set_message("a 1-token prompt has no prefix to transfer");
      continue;
    }
    outcome->set_code(static_cast<int32_t>(o.status.code()));
    outcome->set_message(std::string(o.status.message()));
    if (o.session) outcome->set_payload_bytes(o.session->stats().bytes);
  }
  for (const OpenTarget& o : run.open) {
    if (o.session == nullptr) continue;
    // The link as it is at the end (a reshape reaches sessions under way), else at the start.
    transport::LinkShape link = o.shape;
    {
      absl::MutexLock lock(&mu_);
      auto it = connections_.find(o.address);
      if (it != connections_.end()) link = it->second.shape;
    }
    if (link.enabled()) {
      response->mutable_link()->set_gbps(link.gbps);
      response->mutable_link()->set_latency_us(absl::ToDoubleMicroseconds(link.latency));
    }
    break;
  }
  const StreamReport& report = run.report;
  response->set_prefill_us(Micros(report.prefill_end - report.start));
  response->set_encode_us(Micros(report.encode));
  for (absl::Duration at : report.layer_codes) response->add_layer_codes_us(Micros(at));
  response->set_prefills(prefills_.load());
  response->set_cached_tokens(static_cast<uint32_t>(report.cached_tokens));
  response->set_computed_tokens(static_cast<uint32_t>(report.computed_tokens));
  if (report.computed_tokens > 0) {
    // The pass's own time: what the link held it back while sending is the link's.
    speeds_.ObservePrefill(static_cast<int64_t>(report.computed_tokens),
                           absl::ToDoubleMicroseconds(report.prefill_end - report.start -
                                                      report.send));
  }
}

}  // namespace scd::producer
