// The serving path in one process for tests, every hop real: a coordinator (registry + public
// Inference API), a producer and consumers, each a gRPC server on loopback, codes over a real
// transport backend (optionally shaped). Tests add consumers (each with the pair's artifact or
// none), Start, then call the coordinator's API as a client would.
// Thread-safety: Generate may be called from several threads once started; set-up is not.
#ifndef SCD_TESTS_SERVING_STACK_H_
#define SCD_TESTS_SERVING_STACK_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/work_queue.h"
#include "codec/artifact.h"
#include "consumer/decode_scheduler.h"
#include "consumer/decode_service.h"
#include "coordinator/coordinator_service.h"
#include "producer/producer_service.h"
#include "proto/cluster_secret.h"
#include "proto/grpc_server.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/checked_inference.h"
#include "tests/freezable_proxy.h"
#include "tokenizer/tokenizer.h"
#include "transport/fault_injection.h"
#include "transport/link_shaper.h"

namespace scd::testing {

struct ServedConsumer {
  std::string name;
  std::unique_ptr<LlamaModel> model;
  std::string fingerprint;
  const Artifact* artifact = nullptr;  // the pair's (owned by the stack), or none
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<consumer::SessionRouter> router;
  std::shared_ptr<consumer::Admission> admission;
  std::unique_ptr<consumer::DecodeScheduler> scheduler;  // the node's batch
  std::unique_ptr<WorkQueue> steps;                      // its requests' steps
  std::unique_ptr<consumer::ConsumerPrefixCache> prefix_cache;  // null: off
  std::unique_ptr<consumer::ConsumerControlService> control;
  GrpcServer server;
  std::string address;                    // its server's
  std::unique_ptr<FreezableProxy> proxy;  // in front of it (Options::consumers_behind_proxies)
};

// One Generate's events and token ids, by target.
struct ServingReply {
  grpc::Status status;
  std::map<std::string, std::vector<TokenId>> ids;
  std::map<std::string, std::vector<v1::GenerateEvent>> events;
};

class ServingStack {
 public:
  struct Options {
    std::string backend = "grpc";        // what codes travel over
    transport::LinkShape producer_link;  // shapes what the producer sends (off by default)
    uint32_t consumer_capacity = 16;
    // Each consumer's admission queue (0: a full consumer refuses) and KV budget (0: none).
    uint32_t consumer_max_queued = 0;
    int64_t consumer_kv_budget_bytes = 0;
    consumer::SchedulerOptions scheduling;
    absl::Duration deadline = absl::Seconds(30);
    int64_t producer_prefix_cache_bytes = 0;  // the producer's prefix cache (0: off)
    int64_t consumer_prefix_cache_bytes = 0;  // each consumer's (0: off)
    bool early_prefill = true;                // CoordinatorOptions::early_prefill
    int producer_prefill_threads = 8;         // ProducerModel::prefill_threads
    // Each consumer registered at a FreezableProxy in front of its server (FreezeConsumer).
    bool consumers_behind_proxies = false;
    // A second producer of the same model (ReportSpeeds' name "producer-2"): another that can
    // take a transfer over. Registered busy with one request, so requests route to the first.
    bool second_producer = false;
    // Faults on the first producer's links to the consumers (e.g. a disconnect at a chunk: its
    // transfer lost mid-way); none by default.
    transport::FaultPolicy producer_faults;
  };

  // REQUIRES: `producer` and `tokenizer` outlive the stack.
  ServingStack(const LlamaModel* producer, const Tokenizer* tokenizer, std::string producer_name,
               Options options);
  ~ServingStack();

  // Before Start. `artifact`: the pair's (its consumer identity is set here), or none. `target`:
  // the model name it serves ("": `name`); replicas of a target share it, each its own node.
  void AddConsumer(const std::string& name, std::unique_ptr<LlamaModel> model,
                   std::optional<Artifact> artifact, const std::string& target = "");
  // The consumer `name` dies as a process would for its callers: its server cancels every call
  // at once and answers none after (it stays in the registry: its lease would lapse later).
  void KillConsumer(const std::string& name);
  // The consumer `name` stops answering as a frozen process would (SIGSTOP): its connection stays
  // open and silent. REQUIRES: Options::consumers_behind_proxies.
  void FreezeConsumer(const std::string& name);
  // The producer dies as a process would for its callers: every call on it cancelled, none
  // answered after (its lease would lapse later), so a Prefill fails UNAVAILABLE at once.
  void KillProducer();
  // `name`'s registry node id.
  const std::string& node_id(const std::string& name) const { return node_ids_.at(name); }
  // Starts the producer and the coordinator and registers every node.
  void Start();

  // Streams one request through the coordinator; checks every target got exactly one terminal
  // event and Started first (unless refused before it).
  ServingReply Generate(const v1::GenerateRequest& request);
  // The same, calling `on_event` with each event as it is read (on the calling thread).
  ServingReply Generate(const v1::GenerateRequest& request,
                        const std::function<void(const v1::GenerateEvent&)>& on_event);
  ServingReply Generate(const std::vector<std::string>& targets, const std::string& mode,
                        const std::vector<TokenId>& prompt, int max_tokens);

  // A heartbeat of `node` (a consumer's name, "" the producer) reporting `speeds`, as a node
  // process reports its measured ones (the stack's nodes report none by themselves).
  void ReportSpeeds(const std::string& node, const v1::NodeSpeeds& speeds);
  // The coordinator told that the producer's codes travel under `shape` (as Registry.SetLinkShape
  // tells it; the link itself is not shaped by this).
  void NoteLinkShape(const v1::LinkShape& shape);

  ServedConsumer& consumer(const std::string& name) { return *consumers_.at(name); }
  producer::ProducerControlService& producer_service() { return *producer_service_; }
  // The second producer's (Options::second_producer).
  producer::ProducerControlService& second_producer_service() { return *second_.service; }
  v1::Inference::Stub& stub() { return *stub_; }
  // The coordinator's public address (for a client with channel settings of its own).
  const std::string& coordinator_address() const { return coordinator_address_; }
  const ClusterSecret& secret() const { return secret_; }
  const Tally& coordinator_counters() const { return counters_; }
  coordinator::NodeRegistry& registry() { return registry_; }

 private:
  // One producer node: its transport, service and server.
  struct ProducerParts {
    std::unique_ptr<transport::Transport> transport;
    std::unique_ptr<producer::ProducerControlService> service;
    GrpcServer server;
  };
  // Starts a producer node registered as `name` (ReportSpeeds' name) with `faults` on its links.
  void StartProducer(const std::string& name, const transport::FaultPolicy& faults,
                     ProducerParts* parts);

  const LlamaModel* const producer_;
  const Tokenizer* const tokenizer_;
  const std::string producer_name_;
  const Options options_;
  std::string producer_fp_;
  std::map<std::string, Artifact> artifacts_;  // by artifact id
  std::map<std::string, std::unique_ptr<ServedConsumer>> consumers_;
  std::map<std::string, std::string> node_ids_;  // registry node ids by ReportSpeeds' names
  const ClusterSecret secret_ = ClusterSecret::Random();
  Tally counters_;  // the coordinator's refusals
  coordinator::NodeRegistry registry_{coordinator::RegistryOptions{absl::Seconds(3600)}};
  ProducerParts first_, second_;
  std::unique_ptr<producer::ProducerControlService>& producer_service_ = first_.service;
  GrpcServer& producer_server_ = first_.server;
  std::unique_ptr<coordinator::CoordinatorInferenceService> coordinator_;
  std::unique_ptr<CheckedInferenceService> checked_;
  GrpcServer coordinator_server_;
  std::string coordinator_address_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

}  // namespace scd::testing

#endif  // SCD_TESTS_SERVING_STACK_H_
