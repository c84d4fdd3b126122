#include "transport/session_acceptor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "base/change_notice.h"
#include "base/thread_name.h"

namespace scd::transport {

// ---- SessionAcceptor ---------------------------------------------------------------------------

struct SessionAcceptor::ReadyQueue {
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::deque<std::shared_ptr<ReceiveSession>> sessions ABSL_GUARDED_BY(mu);
  SessionHandler handler ABSL_GUARDED_BY(mu);  // set: sessions go to it, not the queue
};

SessionAcceptor::SessionAcceptor(std::unique_ptr<Listener> listener, ConnectionOptions options)
    : listener_(std::move(listener)),
      options_(std::move(options)),
      ready_(std::make_shared<ReadyQueue>()) {
  accept_thread_ = std::thread([this] {
    NameThisThread("scd-accept");
    AcceptLoop();
  });
}

SessionAcceptor::~SessionAcceptor() { Close(); }

void SessionAcceptor::AcceptLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&ready_->mu);
      if (ready_->closed) return;
    }
    ForgetDeadConnections();
    absl::StatusOr<std::unique_ptr<Link>> link = listener_->Accept(absl::Milliseconds(100));
    if (!link.ok()) {
      if (absl::IsDeadlineExceeded(link.status())) continue;
      if (!absl::IsCancelled(link.status())) {
        spdlog::warn("accepting on {} failed: {}", listener_->address(), link.status().ToString());
      }
      absl::MutexLock lock(&ready_->mu);
      if (ready_->closed || absl::IsCancelled(link.status())) return;
      continue;
    }
    ConnectionOptions options = options_;
    std::weak_ptr<ReadyQueue> queue = ready_;
    options.on_session = [queue](std::shared_ptr<ReceiveSession> session) {
      if (auto q = queue.lock()) {
        absl::MutexLock lock(&q->mu);
        if (q->closed) return;
        if (q->handler) {
          q->handler(std::move(session));
        } else {
          q->sessions.push_back(std::move(session));
        }
      }
    };
    auto connection = TransferConnection::Create(*std::move(link), std::move(options));
    absl::MutexLock lock(&mu_);
    connections_.push_back(std::move(connection));
    NoteChange();
  }
}

void SessionAcceptor::ForgetDeadConnections() {
  std::vector<std::shared_ptr<TransferConnection>> dead;
  {
    absl::MutexLock lock(&mu_);
    auto gone = std::stable_partition(connections_.begin(), connections_.end(),
                                      [](const auto& c) { return c->alive(); });
    dead.assign(std::make_move_iterator(gone), std::make_move_iterator(connections_.end()));
    connections_.erase(gone, connections_.end());
    if (!dead.empty()) NoteChange();
  }
  dead.clear();  // outside the lock: each destructor joins its connection's threads
}

absl::StatusOr<std::shared_ptr<ReceiveSession>> SessionAcceptor::Accept(absl::Duration timeout) {
  absl::MutexLock lock(&ready_->mu);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ready_->mu) {
    return ready_->closed || !ready_->sessions.empty();
  };
  if (!ready_->mu.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("no session on ", listener_->address(),
                                                    " within ", absl::FormatDuration(timeout)));
  }
  if (ready_->closed) return absl::CancelledError("session acceptor closed");
  auto session = std::move(ready_->sessions.front());
  ready_->sessions.pop_front();
  return session;
}

void SessionAcceptor::SetSessionHandler(SessionHandler handler) {
  absl::MutexLock lock(&ready_->mu);
  ready_->handler = std::move(handler);
  while (!ready_->closed && !ready_->sessions.empty()) {
    std::shared_ptr<ReceiveSession> session = std::move(ready_->sessions.front());
    ready_->sessions.pop_front();
    ready_->handler(std::move(session));
  }
}

void SessionAcceptor::Close() {
  {
    absl::MutexLock lock(&ready_->mu);
    if (ready_->closed && !accept_thread_.joinable()) return;
    ready_->closed = true;
    ready_->sessions.clear();
    ready_->handler = nullptr;
  }
  listener_->Close();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::shared_ptr<TransferConnection>> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  connections.clear();  // each destructor ends its sessions and joins its threads
}

size_t SessionAcceptor::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_.size();
}

size_t SessionAcceptor::open_sessions() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& connection : connections_) open += connection->open_sessions();
  return open;
}

}  // namespace scd::transport
