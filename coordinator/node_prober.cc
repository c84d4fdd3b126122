#include "coordinator/node_prober.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/time/clock.h"
#include "coordinator/node_ejection.h"
#include "scd/v1/control.grpc.pb.h"

namespace scd::coordinator {

// One probe: its call's state until it answers.
struct NodeProber::Probe {
  grpc::ClientContext context;
  v1::StatsRequest request;
  v1::NodeStats response;
  std::unique_ptr<v1::Producer::Stub> producer;
  std::unique_ptr<v1::Consumer::Stub> consumer;
};

NodeProber::NodeProber(NodeRegistry* registry, const ClusterSecret* secret, ChannelFor channel)
    : registry_(registry),
      secret_(secret),
      channel_(std::move(channel)),
      ticker_(
          std::make_unique<Clock::Ticker>(registry->clock(), kProbeInterval, [this] { Tick(); })) {}

NodeProber::~NodeProber() {
  ticker_.reset();  // no tick after this; the probes under way answer (or time out) next
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

void NodeProber::Tick() {
  for (const NodeRegistry::DueProbe& due : registry_->TakeDueProbes()) {
    auto probe = std::make_shared<Probe>();
    secret_->Attach(&probe->context);
    probe->context.set_deadline(absl::ToChronoTime(absl::Now() + kProbeTimeout));
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    auto done = [this, probe, node = due.node_id](grpc::Status status) {
      registry_->NoteProbe(node, status.ok());
      if (!status.ok()) {
        spdlog::debug("probe of {} failed: {}", node, status.error_message());
      }
      absl::MutexLock lock(&mu_);
      --running_;
    };
    std::shared_ptr<grpc::Channel> channel = channel_(due.address);
    if (due.role == v1::NODE_ROLE_PRODUCER) {
      probe->producer = v1::Producer::NewStub(channel);
      probe->producer->async()->Stats(&probe->context, &probe->request, &probe->response,
                                      std::move(done));
    } else {
      probe->consumer = v1::Consumer::NewStub(channel);
      probe->consumer->async()->Stats(&probe->context, &probe->request, &probe->response,
                                      std::move(done));
    }
  }
}

}  // namespace scd::coordinator
