#include "proto/health_service.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace scd {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream: one write in flight at a time; a status that changes while one is in flight
// is sent after it (only the newest: a watcher hears the current status, not every flip). Freed
// on the last of gRPC's OnDone and the service's holds (Notify holds a watcher outside the
// service's lock, since a gRPC call may run a reaction before it returns).
class HealthService::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  // `known`: whether the watched service is one of the port's (else it stays SERVICE_UNKNOWN).
  Watcher(HealthService* service, ServingStatus status, bool known)
      : known(known), service_(service) {
    Push(status);
  }

  const bool known;

  void Hold() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Sends `status` unless it is what was last sent.
  void Push(ServingStatus status) {
    absl::MutexLock lock(&mu_);
    wanted_ = status;
    StartNextLocked();
  }

  // Finishes the stream with `status` once no write is in flight.
  void End(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (end_ || finished_) return;
    end_ = true;
    end_status_ = std::move(status);
    StartNextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !end_) {  // the client went away: nothing more can be sent
      end_ = true;
      end_status_ = grpc::Status::CANCELLED;
    }
    StartNextLocked();
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    service_->Remove(this);
    Release();
  }

 private:
  // Calls into gRPC under mu_ only: a reaction that runs before the call returns takes mu_ on
  // gRPC's own threads, never on this one (user reactions are not run inline).
  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (end_) {
      finished_ = true;
      Finish(end_status_);
      return;
    }
    if (sent_ && *sent_ == wanted_) return;
    sent_ = wanted_;
    response_.set_status(wanted_);
    writing_ = true;
    StartWrite(&response_);
  }

  HealthService* const service_;
  std::atomic<int> refs_{1};  // gRPC's, released at OnDone
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  ServingStatus wanted_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  std::optional<ServingStatus> sent_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool end_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

HealthService::HealthService(std::vector<std::string> services, int max_watches)
    : services_(std::move(services)), max_watches_(std::max(0, max_watches)) {}

HealthService::~HealthService() {
  EndWatches();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::set<Watcher*>* watchers) { return watchers->empty(); }, &watchers_));
}

bool HealthService::Knows(const std::string& service) const {
  return service.empty() || service == kHealthServiceName ||
         std::find(services_.begin(), services_.end(), service) != services_.end();
}

void HealthService::SetServing(bool serving) {
  std::vector<Watcher*> held;
  {
    absl::MutexLock lock(&mu_);
    if (serving_ == serving) return;
    serving_ = serving;
    for (Watcher* watcher : watchers_) {
      if (!watcher->known) continue;
      watcher->Hold();
      held.push_back(watcher);
    }
  }
  const ServingStatus status =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  for (Watcher* watcher : held) {
    watcher->Push(status);
    watcher->Release();
  }
}

bool HealthService::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

int HealthService::watches() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(watchers_.size());
}

void HealthService::EndWatches() {
  std::vector<Watcher*> held;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    for (Watcher* watcher : watchers_) {
      watcher->Hold();
      held.push_back(watcher);
    }
  }
  for (Watcher* watcher : held) {
    watcher->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping"));
    watcher->Release();
  }
}

void HealthService::Remove(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Knows(request->service())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 absl::StrCat("no service named \"", request->service(), "\"")));
    return reactor;
  }
  response->set_status(serving() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* /*context*/, const HealthCheckRequest* request) {
  const bool known = Knows(request->service());
  absl::MutexLock lock(&mu_);
  if (ended_ || static_cast<int>(watchers_.size()) >= max_watches_) {
    // A reactor that only finishes: no status is sent.
    class Refused final : public grpc::ServerWriteReactor<HealthCheckResponse> {
     public:
      explicit Refused(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Refused(ended_
                           ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is stopping")
                           : grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                          absl::StrCat("at most ", max_watches_,
                                                       " health Watch streams per port")));
  }
  const ServingStatus status = !known     ? HealthCheckResponse::SERVICE_UNKNOWN
                               : serving_ ? HealthCheckResponse::SERVING
                                          : HealthCheckResponse::NOT_SERVING;
  Watcher* watcher = new Watcher(this, status, known);
  watchers_.insert(watcher);
  return watcher;
}

}  // namespace scd
