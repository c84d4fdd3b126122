// The peer process of `scd-bench ucx-kills` (bench/ucx_kill_stress.h RunUcxKillPeer): a sending
// and a receiving session over the UCX backend, each direction on its own thread, until the peer
// is lost or a SIGTERM asks this side to close everything at once.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/termination_signal.h"
#include "bench/ucx_kill_stress.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::bench {
namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Written whole or not at all (the harness reads it once it appears).
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteStringToFile(tmp, text + "\n"); !s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The peer's address once the harness started it (it listens before writing its file).
absl::StatusOr<std::string> AwaitPeerAddress(const std::string& file) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = ReadFileToString(file);
    if (text.ok() && !text->empty()) {
      return std::string(absl::StripAsciiWhitespace(*text));
    }
    // paces: a one-off wait for the other process's file, at most 30 s (a bench peer)
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat("no peer address in ", file, " within 30 s"));
}

// Both directions' state: what flowed, and the first direction's end (the peer lost).
class Flow {
 public:
  explicit Flow(std::string flowing_file) : flowing_file_(std::move(flowing_file)) {}
  void Sent(size_t bytes) {
    sent_ += bytes;
    MaybeFlowing();
  }
  void Received(size_t bytes) {
    received_ += bytes;
    MaybeFlowing();
  }
  // A direction ended (its session's status): the first end wakes the main thread, which then
  // tells a loss from its own close.
  void Ended(const std::string& direction, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!first_end_.empty()) return;
    first_end_ = absl::StrCat(direction, ": ", status.ToString());
    kill(getpid(), SIGTERM);  // the main thread waits for SIGTERM (base/termination_signal.h)
  }
  std::string first_end() {
    absl::MutexLock lock(&mu_);
    return first_end_;
  }
  std::string Totals() const {
    return absl::StrCat("sent_mib=", sent_.load() >> 20, " received_mib=", received_.load() >> 20);
  }

 private:
  void MaybeFlowing() {
    if (sent_.load() == 0 || received_.load() == 0 || flowing_.exchange(true)) return;
    WriteAtomically(flowing_file_, "flowing").IgnoreError();  // the harness times out without it
  }

  const std::string flowing_file_;
  std::atomic<size_t> sent_{0}, received_{0};
  std::atomic<bool> flowing_{false};
  absl::Mutex mu_;
  std::string first_end_ ABSL_GUARDED_BY(mu_);
};

// What a peer holds: its transport, its listener's sessions, its connection to the peer and the
// session it sends on.
struct Links {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::SessionAcceptor> acceptor;
  std::shared_ptr<transport::TransferConnection> connection;
  std::shared_ptr<transport::SendSession> send;
};

// Listens, tells the harness where, connects to the peer and opens the sending session.
absl::StatusOr<Links> SetUp(const UcxKillPeerOptions& o) {
  Links links;
  transport::TransportOptions options;
  options.backend = "ucx";
  SCD_ASSIGN_OR_RETURN(links.transport, transport::CreateTransport(options));
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<transport::Listener> listener,
                       links.transport->Listen("127.0.0.1:0"));
  links.acceptor = std::make_unique<transport::SessionAcceptor>(std::move(listener),
                                                                transport::ConnectionOptions());
  SCD_RETURN_IF_ERROR(WriteAtomically(o.address_file, links.acceptor->address()));
  SCD_ASSIGN_OR_RETURN(std::string peer, AwaitPeerAddress(o.peer_file));
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<transport::Link> link,
                       links.transport->Connect(peer, absl::Seconds(10)));
  links.connection = transport::TransferConnection::Create(std::move(link), {});
  v1::TransferHeader header;
  header.set_request_id("ucx-kills");
  SCD_ASSIGN_OR_RETURN(links.send, links.connection->StartSession(header, absl::Minutes(10)));
  return links;
}

}  // namespace

int RunUcxKillPeer(const UcxKillPeerOptions& o) {
  CatchTerminationSignals();  // before any thread: every thread inherits the block
  absl::StatusOr<Links> set_up = SetUp(o);
  if (!set_up.ok()) {
    Say(absl::StrCat("RESULT setup_failed ", set_up.status().ToString()));
    return 1;
  }
  Links& links = *set_up;
  Flow flow(o.flowing_file);
  uint8_t* bytes = nullptr;
  const transport::Payload block = transport::Payload::Allocate(o.chunk_bytes, &bytes);
  for (size_t i = 0; i < o.chunk_bytes; ++i) bytes[i] = static_cast<uint8_t>(i * 131);

  std::thread sender([&] {
    absl::Status status;
    while ((status = links.send->SendChunk(v1::CodeChunk(), block)).ok()) {
      flow.Sent(o.chunk_bytes);
    }
    flow.Ended("send", status);
  });
  absl::Mutex receive_mu;
  std::shared_ptr<transport::ReceiveSession> receive;  // guarded by receive_mu
  std::thread receiver([&] {
    absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> session =
        links.acceptor->Accept(absl::Seconds(30));
    if (!session.ok()) return flow.Ended("accept", session.status());
    {
      absl::MutexLock lock(&receive_mu);
      receive = *session;
    }
    for (;;) {
      auto chunk = (*session)->Next(absl::Minutes(10));
      if (!chunk.ok()) return flow.Ended("receive", chunk.status());
      if (!chunk->has_value()) return flow.Ended("receive", absl::OkStatus());
      flow.Received((*chunk)->payload.size());
    }
  });

  WaitForTerminationSignal();
  const std::string lost = flow.first_end();
  // A loss: this side ends what is left. A SIGTERM: this side closes everything mid-transfer.
  links.connection->Close();
  links.acceptor->Close();
  {
    absl::MutexLock lock(&receive_mu);
    if (receive != nullptr) receive->Cancel("ucx-kills: closing");
  }
  sender.join();
  receiver.join();
  links.send.reset();
  links.connection.reset();
  links.acceptor.reset();
  links.transport.reset();
  Say(lost.empty() ? absl::StrCat("RESULT closed ", flow.Totals())
                   : absl::StrCat("RESULT lost ", flow.Totals(), " first_end=\"", lost, "\""));
  return 0;
}

}  // namespace scd::bench
