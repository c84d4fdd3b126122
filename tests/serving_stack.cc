#include "tests/serving_stack.h"

#include <gtest/gtest.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "codec/fingerprint.h"
#include "proto/frontier_proto.h"
#include "proto/prefix_cache_stats.h"
#include "proto/registry_client.h"
#include "proto/wire_mode.h"
#include "tests/test_files.h"
#include "transport/session_acceptor.h"

namespace scd::testing {
namespace {

// `producer`: the producer's transport as its daemon sets it (producer/producer_node.cc): a
// consumer's refused connection fails at once.
std::unique_ptr<transport::Transport> Backend(const std::string& backend, bool producer = false) {
  transport::TransportOptions options;
  options.backend = backend;
  options.grpc_refused_fails_fast = producer;
  return Ok(transport::CreateTransport(options));
}

// A backend whose links to the consumers carry `policy`'s faults (FaultInjectingLink).
class FaultyTransport : public transport::Transport {
 public:
  FaultyTransport(std::unique_ptr<transport::Transport> inner, transport::FaultPolicy policy)
      : inner_(std::move(inner)), policy_(std::move(policy)) {}
  const transport::Capabilities& capabilities() const override { return inner_->capabilities(); }
  absl::StatusOr<std::unique_ptr<transport::Listener>> Listen(const std::string& address) override {
    return inner_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<transport::Link>> Connect(const std::string& address,
                                                           absl::Duration timeout) override {
    absl::StatusOr<std::unique_ptr<transport::Link>> link = inner_->Connect(address, timeout);
    if (!link.ok()) return link.status();
    return std::unique_ptr<transport::Link>(
        std::make_unique<transport::FaultInjectingLink>(*std::move(link), policy_));
  }

 private:
  const std::unique_ptr<transport::Transport> inner_;
  const transport::FaultPolicy policy_;
};

// A gRPC server on 127.0.0.1:<any> with `services`; its address in `*address`.
GrpcServer Serve(const std::vector<grpc::Service*>& services, std::string* address) {
  GrpcServer served = Ok(StartGrpcServer("127.0.0.1:0", services));
  *address = served.address;
  return served;
}

}  // namespace

ServingStack::ServingStack(const LlamaModel* producer, const Tokenizer* tokenizer,
                           std::string producer_name, Options options)
    : producer_(producer),
      tokenizer_(tokenizer),
      producer_name_(std::move(producer_name)),
      options_(std::move(options)),
      producer_fp_(Ok(FingerprintModel(*producer))) {}

ServingStack::~ServingStack() {
  coordinator_server_.Shutdown(absl::Now());
  first_.server.Shutdown(absl::Now());
  second_.server.Shutdown(absl::Now());
  for (auto& [name, node] : consumers_) node->server.Shutdown(absl::Now());
}

void ServingStack::AddConsumer(const std::string& name, std::unique_ptr<LlamaModel> model,
                               std::optional<Artifact> artifact, const std::string& target) {
  const std::string& model_name = target.empty() ? name : target;
  auto node = std::make_unique<ServedConsumer>();
  node->name = name;
  node->model = std::move(model);
  node->fingerprint = Ok(FingerprintModel(*node->model));
  std::map<std::string, const Artifact*> held;
  v1::RegisterRequest request;
  if (artifact) {
    artifact->consumer = Ok(ModelIdentity::Of(*node->model));
    const std::string id = "art-" + name;
    artifacts_[id] = *std::move(artifact);
    node->artifact = held[id] = &artifacts_[id];
    auto* entry = request.add_artifacts();
    entry->set_id(id);
    entry->set_producer_fingerprint(producer_fp_);
    entry->set_consumer_fingerprint(node->fingerprint);
    FrontierToEntry(artifacts_[id].frontier, entry);
  }
  node->transport = Backend(options_.backend);
  node->router =
      std::make_unique<consumer::SessionRouter>(std::make_unique<transport::SessionAcceptor>(
          Ok(node->transport->Listen("127.0.0.1:0")), transport::ConnectionOptions()));
  consumer::ConsumerModel served{node->model.get(), tokenizer_, model_name,
                                 TransferOptions(), 16,         options_.deadline};
  if (options_.consumer_prefix_cache_bytes > 0) {
    node->prefix_cache = std::make_unique<consumer::ConsumerPrefixCache>(
        *node->model, node->fingerprint, options_.consumer_prefix_cache_bytes);
    served.prefix_cache = node->prefix_cache.get();
  }
  consumer::Admission::Options admission;
  admission.capacity = options_.consumer_capacity;
  admission.max_queued = options_.consumer_max_queued;
  admission.budget_bytes = options_.consumer_kv_budget_bytes;
  node->admission = consumer::Admission::Create(admission);
  node->scheduler = std::make_unique<consumer::DecodeScheduler>(*node->model, options_.scheduling);
  served.scheduler = node->scheduler.get();
  node->steps = std::make_unique<WorkQueue>(2);
  served.steps = node->steps.get();
  node->control = std::make_unique<consumer::ConsumerControlService>(served, held, node->admission,
                                                                     node->router.get(), secret_);
  node->server = Serve({node->control.get()}, &node->address);
  std::string registered = node->address;
  if (options_.consumers_behind_proxies) {
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(node->address.substr(node->address.rfind(':') + 1), &port));
    node->proxy = std::make_unique<FreezableProxy>(port);
    registered = node->proxy->address();
  }
  SetNodeIdentity(v1::NODE_ROLE_CONSUMER, registered, model_name, node->fingerprint, &request);
  request.set_transfer_address(node->router->address());
  absl::StatusOr<coordinator::Lease> lease = registry_.Register(request);
  ASSERT_TRUE(lease.ok()) << lease.status();
  node_ids_[name] = lease->node_id;
  if (node->prefix_cache != nullptr) {
    // As a consumer node's first heartbeat: it has a prefix cache (the coordinator then notes the
    // prompts routed to it, and sends no early prefill for a prompt it may hold).
    v1::HeartbeatRequest beat;
    beat.set_node_id(lease->node_id);
    *beat.mutable_prefix_blocks() = PrefixBlocksReport(node->prefix_cache->blocks());
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }
  consumers_[name] = std::move(node);
}

void ServingStack::ReportSpeeds(const std::string& node, const v1::NodeSpeeds& speeds) {
  v1::HeartbeatRequest beat;
  beat.set_node_id(node_ids_.at(node));
  *beat.mutable_speeds() = speeds;
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
}

void ServingStack::NoteLinkShape(const v1::LinkShape& shape) {
  registry_.NoteLinkShape(node_ids_.at(""), shape);
}

void ServingStack::StartProducer(const std::string& name, const transport::FaultPolicy& faults,
                                 ProducerParts* parts) {
  parts->transport = Backend(options_.backend, /*producer=*/true);
  if (!faults.rules.empty()) {
    parts->transport = std::make_unique<FaultyTransport>(std::move(parts->transport), faults);
  }
  producer::ProducerModel model{producer_,         tokenizer_, producer_name_,   producer_fp_,
                                TransferOptions(), {},         options_.deadline};
  for (auto& [id, artifact] : artifacts_) model.artifacts[id] = &artifact;
  model.prefix_cache_bytes = options_.producer_prefix_cache_bytes;
  model.prefill_threads = options_.producer_prefill_threads;
  transport::ConnectionOptions connection;
  connection.shape = options_.producer_link;
  parts->service = std::make_unique<producer::ProducerControlService>(model, parts->transport.get(),
                                                                      secret_, connection);
  std::string producer_address;
  parts->server = Serve({parts->service.get()}, &producer_address);
  v1::RegisterRequest producer;
  SetNodeIdentity(v1::NODE_ROLE_PRODUCER, producer_address, producer_name_, producer_fp_,
                  &producer);
  absl::StatusOr<coordinator::Lease> lease = registry_.Register(producer);
  ASSERT_TRUE(lease.ok()) << lease.status();
  node_ids_[name] = lease->node_id;
}

void ServingStack::Start() {
  StartProducer("", options_.producer_faults, &first_);
  if (options_.second_producer) {
    StartProducer("producer-2", {}, &second_);
    // Reported busy with one request: routing picks the first producer (its faults apply).
    v1::HeartbeatRequest beat;
    beat.set_node_id(node_ids_.at("producer-2"));
    beat.set_active_requests(1);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }

  // As a coordinator node with --tokenizer: text prompts are tokenized at its front, once.
  coordinator::CoordinatorOptions routing;
  routing.tokenizer = tokenizer_;
  routing.early_prefill = options_.early_prefill;
  coordinator_ = std::make_unique<coordinator::CoordinatorInferenceService>(&registry_, secret_,
                                                                           &counters_, routing);
  PublicApiGuards guards;
  guards.tokenizer = tokenizer_;
  checked_ = std::make_unique<CheckedInferenceService>(coordinator_.get(), RequestLimits(),
                                                       /*require_target=*/true, &counters_,
                                                       nullptr, guards);
  coordinator_server_ = Serve({checked_.get()}, &coordinator_address_);
  stub_ = v1::Inference::NewStub(
      grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
}

void ServingStack::KillConsumer(const std::string& name) {
  consumers_.at(name)->server.Shutdown(absl::Now());
}

void ServingStack::KillProducer() { producer_server_.Shutdown(absl::Now()); }

void ServingStack::FreezeConsumer(const std::string& name) {
  ServedConsumer& node = *consumers_.at(name);
  ASSERT_NE(node.proxy, nullptr) << "FreezeConsumer needs Options::consumers_behind_proxies";
  node.proxy->Freeze();
}

ServingReply ServingStack::Generate(const v1::GenerateRequest& request) {
  return Generate(request, nullptr);
}

ServingReply ServingStack::Generate(const v1::GenerateRequest& request,
                                    const std::function<void(const v1::GenerateEvent&)>& on_event) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub_->Generate(&context, request);
  ServingReply reply;
  v1::GenerateEvent event;
  while (reader->Read(&event)) {
    if (on_event) on_event(event);
    reply.events[event.target()].push_back(event);
    if (event.has_token()) {
      for (int32_t id : event.token().ids()) reply.ids[event.target()].push_back(id);
    }
  }
  reply.status = reader->Finish();
  for (const auto& [target, events] : reply.events) {
    int terminal = 0;
    for (const auto& e : events) terminal += e.has_finished() || e.has_error();
    EXPECT_EQ(terminal, 1) << target;
    // Started first, unless refused before it (then the Error is the only event).
    EXPECT_TRUE(events.front().has_started() || (events.size() == 1 && events[0].has_error()))
        << target << ": " << events.front().DebugString();
  }
  return reply;
}

ServingReply ServingStack::Generate(const std::vector<std::string>& targets,
                                    const std::string& mode, const std::vector<TokenId>& prompt,
                                    int max_tokens) {
  v1::GenerateRequest request;
  for (const auto& t : targets) request.add_targets(t);
  SetRequestMode(*ParseRequestedMode(mode), &request);
  for (TokenId id : prompt) request.add_prompt_ids(id);
  request.set_max_tokens(max_tokens);
  return Generate(request);
}

}  // namespace scd::testing
