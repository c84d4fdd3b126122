// The producer's side of the control plane (scd.v1.Producer.Prefill, called by the coordinator
// once every target consumer has admitted the request): tokenize the request's prompt, open one
// transfer session per target at its consumer's transfer address (tagged "<request id>#<target>",
// connections reused per address), run the prefill once and stream each target its codes layer by
// layer (StreamPrefill). The link shape (transport/link_shaper.h) is set at start and may be
// changed at run time (SetLinkShape, the coordinator's bandwidth sweep); PrefillResponse.link
// says which shape a request's codes travelled under. Per-target failures (consumer gone, refused
// header, no artifact) are outcomes, not RPC errors; a prompt that cannot be tokenized is
// INVALID_ARGUMENT. A cancelled call (the coordinator's client went away) cancels every session of
// the request at once. Every call must carry the cluster secret (UNAUTHENTICATED otherwise: nobody
// else makes the producer work or dial an address); sessions are tagged with the request's
// session_id. Thread-safety: thread-safe; concurrent Prefill calls share the model read-only.
// Threads: the prefill queue's (ProducerModel::prefill_threads), none per call.
#ifndef SCD_PRODUCER_PRODUCER_SERVICE_H_
#define SCD_PRODUCER_PRODUCER_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/cancellation.h"
#include "base/tally.h"
#include "base/work_queue.h"
#include "codec/artifact.h"
#include "codec/transfer_plan.h"
#include "model/llama_model.h"
#include "producer/prefix_store.h"
#include "proto/cluster_secret.h"
#include "proto/node_speeds.h"
#include "scd/v1/control.grpc.pb.h"
#include "tokenizer/tokenizer.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::producer {

struct ProducerModel {
  const LlamaModel* model = nullptr;     // not owned
  const Tokenizer* tokenizer = nullptr;  // not owned; null: ids only (dummy weights)
  std::string name;
  std::string fingerprint;
  TransferOptions transfer_options;                  // as every consumer's
  std::map<std::string, const Artifact*> artifacts;  // by artifact id (not owned)
  absl::Duration default_deadline = absl::Seconds(60);
  // The prefix cache's budget (--prefix-cache-mb); 0: no prefix cache.
  int64_t prefix_cache_bytes = 0;
  // Prefills run at once (each runs its forward pass and sends its layers on one of these
  // threads); more wait in the queue, holding nothing.
  int prefill_threads = 8;
};

class ProducerControlService final
    : public v1::Producer::WithCallbackMethod_Prefill<v1::Producer::Service> {
 public:
  // REQUIRES: `transport` and everything in `producer` outlive the service.
  ProducerControlService(ProducerModel producer, transport::Transport* transport,
                         ClusterSecret secret,
                         transport::ConnectionOptions connection_options = {});

  // On gRPC's callback API: the call waits in the prefill queue (ProducerModel::prefill_threads)
  // and runs on its threads; a cancelled call (gRPC tells it at once) ends its sessions.
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  // Prefills running, open sessions, held code bytes, sessions ended by terminal state.
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::NodeStats* stats) override;
  // What Stats answers, without the secret check (the node's /metrics collector).
  void FillStats(v1::NodeStats* stats) const;
  // Sets (or reads) the shape of the links sessions are opened on from now on (control.proto).
  grpc::Status SetLinkShape(grpc::ServerContext* context, const v1::SetLinkShapeRequest* request,
                            v1::LinkShape* shape) override;
  // Prefills run so far (a fan-out request runs one).
  uint64_t prefills() const { return prefills_.load(); }
  // Its prefills' speed (computed tokens against time, encoding included), for the heartbeat.
  v1::NodeSpeeds Speeds() const { return speeds_.Report(); }
  // Prefills running now (reported with each heartbeat as active_requests).
  uint32_t running() const { return running_.load(); }
  // Prompt positions forward passes computed so far (prefix cache hits are not computed).
  uint64_t prefill_tokens() const { return prefill_tokens_.load(); }
  // The prefix cache (null when off).
  ProducerPrefixStore* prefix_store() { return prefix_store_.get(); }
  // The routing keys of the cached prefix blocks, most recently used first (heartbeats).
  std::vector<uint64_t> CachedBlocks(size_t max) const;
  // Transfer sessions not yet ended, over every connection.
  size_t open_sessions() const;
  // Transfer connections held for reuse (one per consumer address); one whose link is gone is
  // dropped, with its threads, when the next session is opened.
  size_t connections() const;

 private:
  struct OpenTarget;
  struct PrefillRun;
  class PrefillCall;
  // One Prefill, checked and run (on a prefill thread); `cancel`: the call's.
  grpc::Status RunPrefill(const v1::PrefillRequest& request, Cancellation* cancel,
                          v1::PrefillResponse* response);
  // Target `i`'s encoder and session (the header sent), or why it has none.
  absl::Status OpenSession(const v1::PrefillRequest& request, int i, const PrefillRun& run,
                           OpenTarget* o);
  // The prefix cache's part of the prefix (waiting for a request computing its next blocks), the
  // claim on what this pass computes, and the reuse the pass is given.
  void LookUpPrefix(Cancellation* cancel, PrefillRun* run);
  // Runs the pass to the open sessions (cancelled with the call); keeps its blocks and codes.
  absl::Status Stream(Cancellation* cancel, PrefillRun* run);
  void Answer(const v1::PrefillRequest& request, const PrefillRun& run,
              v1::PrefillResponse* response);
  // An open connection to `address` shaped as the link shape now set, reused while alive and
  // shaped so (after SetLinkShape the next session opens a new one; running sessions keep the
  // old). `shape`: the shape it travels under.
  absl::StatusOr<std::shared_ptr<transport::TransferConnection>> Connection(
      const std::string& address, transport::LinkShape* shape);
  struct CachedConnection {
    std::shared_ptr<transport::TransferConnection> connection;
    transport::LinkShape shape;
  };

  const ProducerModel producer_;
  transport::Transport* const transport_;
  const ClusterSecret secret_;
  const transport::ConnectionOptions connection_options_;
  std::unique_ptr<ProducerPrefixStore> prefix_store_;  // null: off
  std::atomic<uint64_t> prefills_{0};
  NodeSpeedTracker speeds_;
  std::atomic<uint64_t> prefill_tokens_{0};
  std::atomic<uint32_t> running_{0};
  std::atomic<uint64_t> held_payload_bytes_{0};
  Tally ended_;  // sessions, by terminal state
  mutable absl::Mutex mu_;
  transport::LinkShape shape_ ABSL_GUARDED_BY(mu_);  // for connections opened from now on
  std::map<std::string, CachedConnection> connections_ ABSL_GUARDED_BY(mu_);
  WorkQueue prefill_queue_;  // last: its threads end before the rest goes
};

}  // namespace scd::producer

#endif  // SCD_PRODUCER_PRODUCER_SERVICE_H_
