// The UCX backend's public objects: Transport, Listener and Link over the shared Core
// (ucx_core.h), which does all the work on its progress thread.
#include "transport/ucx/ucx_transport.h"

#include "absl/strings/str_cat.h"
#include "transport/ucx/ucx_core.h"

namespace scd::transport {
namespace {

using ucx_internal::Core;
using ucx_internal::LinkState;
using ucx_internal::ListenerState;

class UcxLink : public Link {
 public:
  UcxLink(std::shared_ptr<Core> core, std::shared_ptr<LinkState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~UcxLink() override { Close(); }

  void Start(LinkHandler* handler) override { core_->Start(state_, handler); }
  absl::Status Send(Frame frame) override { return core_->Send(state_, std::move(frame)); }
  void DropSession(uint64_t session_id) override { core_->DropSession(state_, session_id); }
  void Close() override { core_->CloseLink(state_); }
  std::string Describe() const override { return state_->description; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<LinkState> state_;
};

class UcxListener : public Listener {
 public:
  UcxListener(std::shared_ptr<Core> core, std::shared_ptr<ListenerState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~UcxListener() override { Close(); }

  absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) override {
    absl::MutexLock lock(&state_->mu);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return state_->closed || !state_->accepted.empty();
    };
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("ucx: no connection on ", state_->address,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    if (state_->closed) {
      return absl::CancelledError(absl::StrCat("ucx listener ", state_->address, " closed"));
    }
    std::shared_ptr<LinkState> link = std::move(state_->accepted.front());
    state_->accepted.pop_front();
    return std::unique_ptr<Link>(std::make_unique<UcxLink>(core_, std::move(link)));
  }

  std::string address() const override { return state_->address; }
  void Close() override { core_->CloseListener(state_); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<ListenerState> state_;
};

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  // Links and listeners may outlive the transport; they keep the (shut down) core's memory alive.
  ~UcxTransport() override { core_->Shutdown(); }

  const Capabilities& capabilities() const override { return core_->capabilities(); }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    auto state = core_->Listen(address);
    if (!state.ok()) return state.status();
    return std::unique_ptr<Listener>(std::make_unique<UcxListener>(core_, *std::move(state)));
  }

  absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                absl::Duration timeout) override {
    auto state = core_->Connect(address, timeout);
    if (!state.ok()) return state.status();
    return std::unique_ptr<Link>(std::make_unique<UcxLink>(core_, *std::move(state)));
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options) {
  auto core = Core::Create(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(*std::move(core)));
}

}  // namespace scd::transport
