// The gRPC backend's transport: a grpc::Server per Listen whose Transfer method hands each incoming
// stream to a LinkCore (grpc_link.h), and client links on channels of their own. Throughput
// (loopback): a fixed 16 MiB HTTP/2 stream window, the shared receive pool and raised glibc malloc
// thresholds (RaiseMallocThresholds) each mattered; see the comments there.
#include "transport/grpc/grpc_transport.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/connection_gate.h"
#include "base/exception_guard.h"
#include "base/grpc_library.h"
#include "base/grpc_tls.h"
#include "base/host_port.h"
#include "base/status_macros.h"
#include "scd/v1/transfer.grpc.pb.h"
#include "transport/grpc/grpc_link.h"
#include "transport/receive_pool.h"

namespace scd::transport {
namespace {

using ::grpc::ByteBuffer;
using grpc_internal::CloseAll;
using grpc_internal::EmptyGraveyard;
using grpc_internal::kMetaAllowance;
using grpc_internal::LinkCore;
using grpc_internal::NewGrpcLink;
using grpc_internal::NewServerStream;
using grpc_internal::RejectStream;
using grpc_internal::StartClientStream;

// Transport destruction: the server's grace before it cancels what is left.
constexpr absl::Duration kServerShutdownGrace = absl::Milliseconds(250);
// HTTP/2 stream flow-control window (at least; 4 messages when those are larger).
constexpr size_t kStreamWindowBytes = size_t{16} << 20;

// Receive buffers: chunks below 256 KiB come from the allocator (which reuses them well); at most
// 256 MiB of released buffers are kept for the next chunks.
ReceivePool::Options PoolOptions() {
  ReceivePool::Options options;
  options.max_mapped_bytes = SIZE_MAX;  // bounded by the HTTP/2 window and the consumers' pace
  options.max_idle_bytes = size_t{256} << 20;
  options.min_pooled_bytes = size_t{256} << 10;
  return options;
}

absl::StatusOr<HostPort> ParseAddress(const std::string& address) {
  absl::StatusOr<HostPort> host_port = ParseHostPort(address);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("grpc: ", host_port.status().message()));
  }
  return host_port;
}

int ClampToInt(int64_t value) { return static_cast<int>(std::clamp<int64_t>(value, 1, INT_MAX)); }

// Channel arguments both ends share.
std::vector<std::pair<std::string, int>> CommonArgs(const TransportOptions& options) {
  const int interval = ClampToInt(absl::ToInt64Milliseconds(options.grpc_keepalive_interval));
  const int timeout = ClampToInt(absl::ToInt64Milliseconds(options.grpc_keepalive_timeout));
  // HTTP/2 stream window. gRPC's default (64 KiB, grown by BDP probing) keeps a bulk stream
  // waiting for WINDOW_UPDATEs: on loopback a fixed large window more than doubled goodput and
  // halved CPU per byte. It bounds what a receiver buffers per link.
  const int window = ClampToInt(
      static_cast<int64_t>(std::max(kStreamWindowBytes, 4 * options.grpc_max_message_bytes)));
  return {
      // Keepalive: a peer that stops answering pings is declared dead after interval + timeout,
      // also on idle links and between messages.
      {GRPC_ARG_KEEPALIVE_TIME_MS, interval},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, timeout},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
      {GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, interval},
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, window},
  };
}

int MessageLimit(const TransportOptions& options) {
  return ClampToInt(static_cast<int64_t>(options.grpc_max_message_bytes + kMetaAllowance + 1024));
}

class ServerState;

using TransferServiceBase =
    scd::v1::Transfer::WithRawCallbackMethod_Transfer<scd::v1::Transfer::Service>;

class TransferService final : public TransferServiceBase {
 public:
  explicit TransferService(ServerState* owner) : owner_(owner) {}
  using TransferServiceBase::Transfer;
  grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* Transfer(
      grpc::CallbackServerContext* context) override;

 private:
  ServerState* owner_;
};

// One grpc::Server and the links it accepted. Lives until the transport is destroyed (closing the
// Listener only stops accepting), since shutting the server down would cancel accepted links.
class ServerState {
 public:
  ServerState(const TransportOptions& options, std::shared_ptr<ReceivePool> pool)
      : options_(options), pool_(std::move(pool)), service_(this) {}
  ~ServerState() { Shutdown(); }

  absl::Status Start(const std::string& address, HostPort host_port) {
    // The listening socket is a ConnectionGate's (base/connection_gate.h): no SO_REUSEPORT (a
    // busy port is an error), and half-open connections cannot exhaust descriptors and stop
    // gRPC's own accept loop for good; gRPC gets each connection once its preface arrived.
    ConnectionGateOptions gate_options;
    gate_options.preface = kHttp2ClientPreface;
    if (host_port.host.empty()) host_port.host = "::";  // ":9000": every interface, "[::]:9000"
    const std::string listen = host_port.ToString();
    // With TLS (base/grpc_tls.h) gRPC listens itself: a TLS ClientHello is no HTTP/2 preface.
    const bool tls = ServesTls();
    absl::StatusOr<std::unique_ptr<ConnectionGate>> gate =
        tls ? std::unique_ptr<ConnectionGate>() : ConnectionGate::Listen(listen, gate_options);
    if (!gate.ok()) {
      return absl::UnavailableError(
          absl::StrCat("grpc: cannot listen on ", address, ": ", gate.status().message()));
    }
    HoldGrpcLibrary();            // a gated server takes no credentials that would take it
    grpc::ServerBuilder builder;  // without TLS, no listening port of its own
    std::shared_ptr<int> tls_port;
    if (tls) tls_port = AddTlsListeningPort(&builder, listen);
    builder.RegisterService(&service_);
    for (const auto& [name, value] : CommonArgs(options_)) builder.AddChannelArgument(name, value);
    const int interval =
        ClampToInt(absl::ToInt64Milliseconds(options_.grpc_keepalive_interval) / 2);
    // The clients ping every keepalive interval; the server must not count that as abuse.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, interval);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.SetMaxReceiveMessageSize(MessageLimit(options_));
    builder.SetMaxSendMessageSize(MessageLimit(options_));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || (tls && *tls_port == 0)) {
      return absl::UnavailableError(absl::StrCat("grpc: cannot start a server for ", address));
    }
    if (tls) {
      host_port.port = static_cast<uint16_t>(*tls_port);
      address_ = host_port.ToString();
      spdlog::debug("grpc: listening on {} (TLS)", address_);
      return absl::OkStatus();
    }
    gate_ = *std::move(gate);
    host_port.port = static_cast<uint16_t>(gate_->port());
    address_ = host_port.ToString();
    grpc::Server* server = server_.get();
    gate_->Start([server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
    spdlog::debug("grpc: listening on {}", address_);
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* OnIncoming(
      grpc::CallbackServerContext* context) {
    absl::MutexLock lock(&mu_);
    if (!accepting_) {
      return RejectStream(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("listener ", address_, " is closed")));
    }
    auto core =
        std::make_shared<LinkCore>(absl::StrCat("grpc ", address_, " <- ", context->peer()),
                                   /*is_client=*/false, options_.grpc_max_message_bytes, pool_);
    auto* stream = NewServerStream(context, core);
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const std::weak_ptr<LinkCore>& l) { return l.expired(); }),
                 links_.end());
    links_.push_back(core);
    pending_.push_back(std::move(core));
    return stream;
  }

  absl::StatusOr<std::shared_ptr<LinkCore>> Accept(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pending_.empty() || !accepting_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (!accepting_) return absl::CancelledError(absl::StrCat("listener ", address_, " closed"));
    if (pending_.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no link arrived at ", address_, " within ", absl::FormatDuration(timeout)));
    }
    std::shared_ptr<LinkCore> core = std::move(pending_.front());
    pending_.pop_front();
    return core;
  }

  // Refuses further streams and closes the ones not yet accepted.
  void CloseAccepting() {
    std::vector<std::shared_ptr<LinkCore>> unaccepted;
    {
      absl::MutexLock lock(&mu_);
      accepting_ = false;
      unaccepted.assign(pending_.begin(), pending_.end());
      pending_.clear();
    }
    CloseAll(unaccepted);
  }

  void AppendLinks(std::vector<std::shared_ptr<LinkCore>>* out) {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : links_) {
      if (auto link = weak.lock()) out->push_back(std::move(link));
    }
  }

  // Stops the server; its links should be closed first (what is left is cancelled).
  void Shutdown() {
    if (gate_) gate_->Stop();  // first: no connection reaches a server going away
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ToChronoTime(absl::Now() + kServerShutdownGrace));
    server_.reset();
  }

 private:
  const TransportOptions options_;
  const std::shared_ptr<ReceivePool> pool_;
  std::string address_;
  absl::Mutex mu_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  std::deque<std::shared_ptr<LinkCore>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<LinkCore>> links_ ABSL_GUARDED_BY(mu_);
  TransferService service_;               // outlives server_
  std::unique_ptr<grpc::Server> server_;  // set by Start, reset by Shutdown (user threads)
  std::unique_ptr<ConnectionGate> gate_;  // hands server_ its connections
};

grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* TransferService::Transfer(
    grpc::CallbackServerContext* context) {
  try {
    return owner_->OnIncoming(context);
  } catch (const std::exception& e) {
    spdlog::error("grpc: taking an incoming stream failed: {}", e.what());
  } catch (...) {
    spdlog::error("grpc: taking an incoming stream failed");
  }
  return RejectStream(grpc::Status(grpc::StatusCode::INTERNAL, "cannot take the stream"));
}

class GrpcListener final : public Listener {
 public:
  explicit GrpcListener(std::shared_ptr<ServerState> server) : server_(std::move(server)) {}
  ~GrpcListener() override { Close(); }

  absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) override {
    return GuardExceptions("grpc Listener::Accept", [&]() -> absl::StatusOr<std::unique_ptr<Link>> {
      SCD_ASSIGN_OR_RETURN(std::shared_ptr<LinkCore> core, server_->Accept(timeout));
      return NewGrpcLink(std::move(core));
    });
  }
  std::string address() const override { return server_->address(); }
  void Close() override {
    absl::Status status = GuardExceptions("grpc Listener::Close", [&] {
      server_->CloseAccepting();
      return absl::OkStatus();
    });
    if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  }

 private:
  std::shared_ptr<ServerState> server_;
};

class GrpcTransport final : public Transport {
 public:
  explicit GrpcTransport(const TransportOptions& options) : options_(options) {
    capabilities_.backend = "grpc";
    capabilities_.cross_process = true;
    capabilities_.zero_copy_send = false;
    capabilities_.rdma = false;
    capabilities_.gpu_memory = false;
    capabilities_.max_message_bytes = options.grpc_max_message_bytes;
    capabilities_.devices = {"tcp"};
    grpc_internal::StartReaper();
  }

  ~GrpcTransport() override {
    try {
      Shutdown();
    } catch (const std::exception& e) {
      spdlog::error("grpc transport shutdown: {}", e.what());
    } catch (...) {
      spdlog::error("grpc transport shutdown failed");
    }
  }

  const Capabilities& capabilities() const override { return capabilities_; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    return GuardExceptions("grpc Listen", [&]() -> absl::StatusOr<std::unique_ptr<Listener>> {
      SCD_ASSIGN_OR_RETURN(HostPort host_port, ParseAddress(address));
      auto server = std::make_shared<ServerState>(options_, pool_);
      SCD_RETURN_IF_ERROR(server->Start(address, host_port));
      absl::MutexLock lock(&mu_);
      servers_.push_back(server);
      return std::make_unique<GrpcListener>(std::move(server));
    });
  }

  absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                absl::Duration timeout) override {
    return GuardExceptions("grpc Connect", [&]() -> absl::StatusOr<std::unique_ptr<Link>> {
      return DoConnect(address, timeout);
    });
  }

 private:
  absl::StatusOr<std::unique_ptr<Link>> DoConnect(const std::string& address,
                                                  absl::Duration timeout) {
    SCD_ASSIGN_OR_RETURN(HostPort host_port, ParseAddress(address));
    if (host_port.port == 0 || host_port.host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("grpc: cannot connect to ", address, ": ",
                                                     host_port.port == 0 ? "port 0" : "no host"));
    }
    EmptyGraveyard();
    const absl::Time deadline = absl::Now() + timeout;
    std::shared_ptr<grpc::Channel> channel = NewGrpcChannel(address, ChannelArgs());
    SCD_RETURN_IF_ERROR(AwaitConnected(*channel, address, deadline, timeout));
    auto core =
        std::make_shared<LinkCore>(absl::StrCat("grpc ", address, " (client)"),
                                   /*is_client=*/true, options_.grpc_max_message_bytes, pool_);
    core->set_channel(channel);
    {
      grpc::GenericStub stub(channel);
      StartClientStream(core, &stub);
    }
    channel.reset();
    if (!core->WaitReady(deadline)) {
      core->Close();
      absl::Status why = core->final_status();
      return absl::UnavailableError(
          absl::StrCat("grpc: ", address, " did not take the link within ",
                       absl::FormatDuration(timeout), why.ok() ? "" : ": ", why.message()));
    }
    {
      absl::MutexLock lock(&mu_);
      clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                    [](const std::weak_ptr<LinkCore>& l) { return l.expired(); }),
                     clients_.end());
      clients_.push_back(core);
    }
    spdlog::debug("{}: connected", core->description());
    return NewGrpcLink(std::move(core));
  }

  // Waits on the channel's state changes (no polling) until it is READY; with
  // grpc_refused_fails_fast a TRANSIENT_FAILURE (refused, unreachable) ends the wait at once.
  absl::Status AwaitConnected(grpc::Channel& channel, const std::string& address,
                              absl::Time deadline, absl::Duration timeout) const {
    for (grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
         state != GRPC_CHANNEL_READY; state = channel.GetState(/*try_to_connect=*/true)) {
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && options_.grpc_refused_fails_fast) {
        return absl::UnavailableError(
            absl::StrCat("grpc: cannot connect to ", address, ": refused or unreachable"));
      }
      if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
        return absl::UnavailableError(absl::StrCat("grpc: cannot connect to ", address, " within ",
                                                   absl::FormatDuration(timeout)));
      }
    }
    return absl::OkStatus();
  }

  grpc::ChannelArguments ChannelArgs() const {
    grpc::ChannelArguments args;
    for (const auto& [name, value] : CommonArgs(options_)) args.SetInt(name, value);
    // Each link gets a TCP connection of its own (gRPC would share one between equal channels).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Retries would buffer sent messages for replay; a link never replays.
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    // A listener that comes up during Connect's timeout is found quickly.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(MessageLimit(options_));
    args.SetMaxSendMessageSize(MessageLimit(options_));
    return args;
  }

  // Closes every link (client and accepted) together, then stops the servers.
  void Shutdown() {
    std::vector<std::shared_ptr<LinkCore>> links;
    std::vector<std::shared_ptr<ServerState>> servers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& weak : clients_) {
        if (auto link = weak.lock()) links.push_back(std::move(link));
      }
      clients_.clear();
      servers.swap(servers_);
    }
    for (const auto& server : servers) {
      server->CloseAccepting();
      server->AppendLinks(&links);
    }
    CloseAll(links);
    for (const auto& server : servers) server->Shutdown();
    EmptyGraveyard();
  }

  const TransportOptions options_;
  Capabilities capabilities_;
  const std::shared_ptr<ReceivePool> pool_ = ReceivePool::Create(PoolOptions());
  absl::Mutex mu_;
  std::vector<std::weak_ptr<LinkCore>> clients_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ServerState>> servers_ ABSL_GUARDED_BY(mu_);
};

// glibc trims an arena's free top back to the kernel once it exceeds M_TRIM_THRESHOLD, 128 KiB
// until the process first frees a large mmapped block, when glibc raises that threshold (and the
// mmap threshold) to fit the block. Until then gRPC's 64 KiB read buffers are handed back and
// faulted in again on nearly every read; on the development VM those page faults and the TLB
// shootdowns of the trims cost more than all the copying (300 MB/s instead of 3.5 GB/s for
// 4 MiB chunks). Freeing one 32 MiB block applies glibc's own adjustment up front (mmap threshold
// 32 MiB, trim threshold 64 MiB). Process-wide, once; a process that set these thresholds itself
// (mallopt, MALLOC_*_ env) keeps its settings, since glibc then stops adjusting them.
void RaiseMallocThresholds() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    // Just under glibc's 32 MiB cap for the adjustment (DEFAULT_MMAP_THRESHOLD_MAX).
    void* block = std::malloc((size_t{32} << 20) - (size_t{64} << 10));
    // Keeps the compiler from eliding the pair.
    asm volatile("" : : "r"(block) : "memory");
    std::free(block);
  });
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewGrpcTransport(const TransportOptions& options) {
  if (options.grpc_max_message_bytes == 0 ||
      options.grpc_max_message_bytes > static_cast<size_t>(INT_MAX) - 2 * kMetaAllowance) {
    return absl::InvalidArgumentError(absl::StrCat("grpc: grpc_max_message_bytes ",
                                                   options.grpc_max_message_bytes,
                                                   " is outside 1 .. 2 GiB - 2 MiB"));
  }
  if (options.grpc_keepalive_interval <= absl::ZeroDuration() ||
      options.grpc_keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("grpc: keepalive interval and timeout must be positive");
  }
  return GuardExceptions("NewGrpcTransport", [&]() -> absl::StatusOr<std::unique_ptr<Transport>> {
    RaiseMallocThresholds();
    return std::make_unique<GrpcTransport>(options);
  });
}

}  // namespace scd::transport
