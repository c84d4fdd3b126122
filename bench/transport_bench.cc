// scd-transport-bench: goodput of one transfer session (K chunks of N bytes, sender's bytes sent
// as a view, CRC-32C on every chunk, credits, ack at the end) and the fixed cost of a session
// carrying one 640-byte chunk end to end (header, chunk, trailer, ack), over one backend. For
// cross-process backends the receiver is a child process (forked before any transport exists),
// as ucx_perftest's server is. UCX honours UCX_TLS.
//
//   scd-transport-bench --backend ucx --bytes 4194304 --iters 256 [--sessions 1000] [--json]
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "transport/frame_message.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

namespace scd::transport {
namespace {

struct BenchOptions {
  std::string backend = "ucx";
  // "link": the backend alone (frames over a Link, what ucx_perftest measures for UCX);
  // "session": the full protocol on top (CRC-32C both sides, credits, ack).
  std::string level = "session";
  size_t bytes = size_t{1} << 20;
  int iters = 64;
  int sessions = 1000;
  size_t max_inflight_mb = 64;  // the services' default (--max-inflight-mb)
  double link_gbps = 0;         // shaper (0 = off)
  double link_latency_us = 0;
  bool json = false;
};

// `n` bytes of a pattern in memory backed by transparent huge pages: 2 MiB-aligned, rounded up to
// whole huge pages (as UCX's "thp" allocator does for ucx_perftest's buffers), advised, touched.
struct HugeBlock {
  explicit HugeBlock(size_t n) {
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t rounded = (std::max(n, size_t{1}) + kHugePage - 1) / kHugePage * kHugePage;
    if (posix_memalign(&data, kHugePage, rounded) != 0) std::abort();
    madvise(data, rounded, MADV_HUGEPAGE);
    std::memset(data, 'g', rounded);
  }
  ~HugeBlock() { std::free(data); }
  HugeBlock(const HugeBlock&) = delete;
  HugeBlock& operator=(const HugeBlock&) = delete;
  void* data = nullptr;
};

// The receiving side: drains every session it is given until killed / closed.
void Serve(SessionAcceptor& acceptor, const bool* stop) {
  while (!*stop) {
    auto session = acceptor.Accept(absl::Milliseconds(200));
    if (!session.ok()) {
      if (absl::IsDeadlineExceeded(session.status())) continue;
      return;
    }
    for (;;) {
      auto chunk = (*session)->Next(absl::Seconds(60));
      if (!chunk.ok() || !chunk->has_value()) break;
    }
  }
}

// A link-level frame: a chunk of `payload`, a trailer or an ack for round `session`.
Frame BenchFrame(uint64_t session, FrameType type, Payload payload = Payload()) {
  v1::TransferFrame message;
  message.set_session_id(session);
  switch (type) {
    case FrameType::kChunk:
      message.mutable_chunk()->set_payload_bytes(payload.size());
      break;
    case FrameType::kTrailer:
      message.mutable_trailer();
      break;
    default:
      message.mutable_ack();
      break;
  }
  return *FrameFromMessage(message, std::move(payload));  // every body above has a frame type
}

// Link level, receiving side: drops every chunk on arrival and acks each trailer.
class LinkSink : public LinkHandler {
 public:
  explicit LinkSink(std::unique_ptr<Link> link) : link_(std::move(link)) { link_->Start(this); }
  ~LinkSink() override { link_.reset(); }
  void OnFrame(Frame frame) override {
    if (frame.type != FrameType::kTrailer) return;
    link_->Send(BenchFrame(frame.session_id, FrameType::kAck)).IgnoreError();
  }
  void OnLinkDown(absl::Status) override {}

 private:
  std::unique_ptr<Link> link_;
};

// Link level, sending side: counts acks.
class AckCounter : public LinkHandler {
 public:
  void OnFrame(Frame frame) override {
    absl::MutexLock lock(&mu_);
    if (frame.type == FrameType::kAck) ++acks_;
  }
  void OnLinkDown(absl::Status) override {
    absl::MutexLock lock(&mu_);
    down_ = true;
  }
  bool WaitFor(int acks) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return down_ || acks_ >= acks; };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(600));
    return acks_ >= acks;
  }

 private:
  absl::Mutex mu_;
  int acks_ ABSL_GUARDED_BY(mu_) = 0;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
};

void ServeLinks(Listener& listener, std::vector<std::unique_ptr<LinkSink>>* sinks) {
  for (;;) {
    auto link = listener.Accept(absl::Milliseconds(200));
    if (link.ok()) {
      sinks->push_back(std::make_unique<LinkSink>(*std::move(link)));
    } else if (!absl::IsDeadlineExceeded(link.status())) {
      return;
    }
  }
}

// Link level: `chunks` frames of the block, a trailer, and the time until the receiver's ack.
absl::StatusOr<double> SendOverLink(Link& link, AckCounter& acks, int round, int chunks,
                                    absl::string_view block) {
  const absl::Time start = absl::Now();
  for (int i = 0; i < chunks; ++i) {
    SCD_RETURN_IF_ERROR(link.Send(BenchFrame(
        round, FrameType::kChunk,
        Payload(reinterpret_cast<const uint8_t*>(block.data()), block.size(), nullptr))));
  }
  SCD_RETURN_IF_ERROR(link.Send(BenchFrame(round, FrameType::kTrailer)));
  if (!acks.WaitFor(round)) return absl::UnavailableError("link went down before the ack");
  return absl::ToDoubleSeconds(absl::Now() - start);
}

[[noreturn]] void ServeChild(const BenchOptions& options, int address_fd) {
  TransportOptions transport_options;
  transport_options.backend = options.backend;
  auto transport = CreateTransport(transport_options);
  if (!transport.ok()) _exit(2);
  auto listener = (*transport)->Listen("127.0.0.1:0");
  if (!listener.ok()) _exit(3);
  const std::string address = (*listener)->address() + "\n";
  if (options.level == "link") {
    if (write(address_fd, address.data(), address.size()) < 0) _exit(4);
    close(address_fd);
    std::vector<std::unique_ptr<LinkSink>> sinks;
    ServeLinks(**listener, &sinks);
    _exit(0);
  }
  SessionAcceptor acceptor(*std::move(listener), {});
  if (write(address_fd, address.data(), address.size()) < 0) _exit(4);
  close(address_fd);
  const bool stop = false;
  Serve(acceptor, &stop);
  _exit(0);
}

int Run(const BenchOptions& options) {
  // Cross-process backends (all but inproc): fork the receiver first, before any thread exists
  // here -- creating a transport starts process-wide threads (the connections' ticks, the clock's
  // timer) that a forked child would lack while their state says they run (its sessions then
  // hung, or crashed on a freed condition).
  pid_t child = -1;
  std::string address;
  TransportOptions transport_options;
  transport_options.backend = options.backend;
  const bool cross_process = options.backend != "inproc";
  absl::StatusOr<std::unique_ptr<Transport>> transport =
      absl::FailedPreconditionError("not created");
  std::unique_ptr<SessionAcceptor> local;
  std::thread local_thread;
  bool stop = false;
  if (cross_process) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    child = fork();
    if (child == 0) {
      close(fds[0]);
      ServeChild(options, fds[1]);
    }
    close(fds[1]);
    char buffer[256];
    const ssize_t n = read(fds[0], buffer, sizeof(buffer) - 1);
    close(fds[0]);
    if (n <= 0) {
      std::fprintf(stderr, "scd-transport-bench: the receiver process did not start\n");
      return 2;
    }
    address.assign(buffer, static_cast<size_t>(n) - 1);
  }
  transport = CreateTransport(transport_options);
  if (!transport.ok()) {
    std::fprintf(stderr, "scd-transport-bench: %s\n", transport.status().ToString().c_str());
    return 2;
  }
  if (!cross_process && options.level == "link") {
    std::fprintf(stderr, "scd-transport-bench: --level link needs a cross-process backend\n");
    return 2;
  }
  if (!cross_process) {
    local =
        std::make_unique<SessionAcceptor>(*(*transport)->Listen("bench:0"), ConnectionOptions{});
    address = local->address();
    local_thread = std::thread([&] { Serve(*local, &stop); });
  }
  auto link = (*transport)->Connect(address, absl::Seconds(10));
  if (!link.ok()) {
    std::fprintf(stderr, "scd-transport-bench: %s\n", link.status().ToString().c_str());
    return 2;
  }
  // The bytes every chunk is a view of: 2 MiB-aligned and advised for transparent huge pages, as
  // ucx_perftest's own buffers are (its "thp" allocation), so cma pins one page per 2 MiB on both
  // sides of the comparison.
  const HugeBlock hugeblock(options.bytes);
  const absl::string_view block(static_cast<const char*>(hugeblock.data), options.bytes);
  if (options.level == "link") {
    AckCounter acks;
    (*link)->Start(&acks);
    absl::StatusOr<double> warm = SendOverLink(**link, acks, 1, options.iters, block);
    absl::StatusOr<double> seconds = SendOverLink(**link, acks, 2, options.iters, block);
    if (!warm.ok() || !seconds.ok()) {
      std::fprintf(stderr, "scd-transport-bench: %s\n",
                   (warm.ok() ? seconds.status() : warm.status()).ToString().c_str());
      return 1;
    }
    const double total = static_cast<double>(options.bytes) * options.iters;
    const char* tls = std::getenv("UCX_TLS");
    std::printf(
        "%s{\"backend\": \"%s\", \"level\": \"link\", \"ucx_tls\": \"%s\", "
        "\"bytes\": %zu, \"iters\": %d, \"goodput_gbps\": %.4f, "
        "\"goodput_mib_s\": %.1f}\n",
        options.json ? "" : "link level: ", options.backend.c_str(), tls ? tls : "", options.bytes,
        options.iters, total * 8 / *seconds / 1e9, total / *seconds / (1 << 20));
    (*link).reset();
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 0;
  }
  ConnectionOptions connection_options;
  connection_options.max_inflight_bytes = options.max_inflight_mb << 20;
  connection_options.shape.gbps = options.link_gbps;
  connection_options.shape.latency = absl::Microseconds(options.link_latency_us);
  auto connection = TransferConnection::Create(*std::move(link), connection_options);

  // Goodput: a warm-up session, then the measured one.
  auto send_session = [&](int chunks) -> absl::StatusOr<double> {
    const absl::Time start = absl::Now();
    auto session = connection->StartSession(v1::TransferHeader(), absl::Seconds(600));
    if (!session.ok()) return session.status();
    for (int i = 0; i < chunks; ++i) {
      absl::Status sent = (*session)->SendChunk(
          v1::CodeChunk(),
          Payload(reinterpret_cast<const uint8_t*>(block.data()), block.size(), nullptr));
      if (!sent.ok()) return sent;
    }
    absl::Status done = (*session)->Finish();
    if (!done.ok()) return done;
    return absl::ToDoubleSeconds(absl::Now() - start);
  };
  // The warm-up is as large as the measured run, so receive pools and page tables are in their
  // steady state (a serving daemon's), as ucx_perftest's reused buffers are.
  absl::StatusOr<double> warm = send_session(options.iters);
  absl::StatusOr<double> seconds = send_session(options.iters);
  if (!warm.ok() || !seconds.ok()) {
    std::fprintf(stderr, "scd-transport-bench: %s\n",
                 (warm.ok() ? seconds.status() : warm.status()).ToString().c_str());
    return 1;
  }
  const double total = static_cast<double>(options.bytes) * options.iters;
  const double goodput_gbps = total * 8 / *seconds / 1e9;

  // Fixed cost of a session: one 640-byte chunk end to end.
  std::vector<double> micros;
  const std::string small(640, 's');
  for (int i = 0; i < options.sessions; ++i) {
    const absl::Time start = absl::Now();
    auto session = connection->StartSession(v1::TransferHeader(), absl::Seconds(10));
    if (!session.ok()) break;
    (*session)
        ->SendChunk(v1::CodeChunk(),
                    Payload(reinterpret_cast<const uint8_t*>(small.data()), small.size(), nullptr))
        .IgnoreError();
    if (!(*session)->Finish().ok()) break;
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  const char* tls = std::getenv("UCX_TLS");
  if (options.json) {
    std::printf(
        "{\"backend\": \"%s\", \"level\": \"session\", \"ucx_tls\": \"%s\", \"bytes\": %zu, "
        "\"iters\": %d, "
        "\"goodput_gbps\": %.4f, \"goodput_mib_s\": %.1f, \"sessions\": %zu, "
        "\"session_p50_us\": %.1f, \"session_p99_us\": %.1f}\n",
        options.backend.c_str(), tls ? tls : "", options.bytes, options.iters, goodput_gbps,
        total / *seconds / (1 << 20), micros.size(), Percentile(micros, 0.5),
        Percentile(micros, 0.99));
  } else {
    std::printf(
        "%s%s%s: %d x %zu B: %.2f Gbit/s (%.0f MiB/s); session with one 640 B chunk: "
        "p50 %.1f us, p99 %.1f us over %zu sessions\n",
        options.backend.c_str(), tls ? " UCX_TLS=" : "", tls ? tls : "", options.iters,
        options.bytes, goodput_gbps, total / *seconds / (1 << 20), Percentile(micros, 0.5),
        Percentile(micros, 0.99), micros.size());
  }
  connection->Close();
  connection.reset();
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  if (local) {
    stop = true;
    local->Close();
    local_thread.join();
  }
  return 0;
}

}  // namespace
}  // namespace scd::transport

int main(int argc, char** argv) {
  scd::transport::BenchOptions options;
  CLI::App app{"Transfer-session goodput and fixed cost over one transport backend"};
  app.add_option("--backend", options.backend, "inproc | grpc | ucx (UCX honours UCX_TLS)");
  app.add_option("--level", options.level,
                 "link: the backend alone; session: with CRC-32C, credits and ack")
      ->check(CLI::IsMember({"link", "session"}));
  app.add_option("--bytes", options.bytes, "chunk size in bytes")->check(CLI::PositiveNumber);
  app.add_option("--iters", options.iters, "chunks in the measured session")
      ->check(CLI::PositiveNumber);
  app.add_option("--sessions", options.sessions, "sessions for the fixed-cost measurement");
  app.add_option("--max-inflight-mb", options.max_inflight_mb, "sender's in-flight window");
  app.add_option("--link-gbps", options.link_gbps, "shape the sender's link (token bucket)");
  app.add_option("--link-latency-us", options.link_latency_us, "one-way latency added per frame");
  app.add_flag("--json", options.json, "one JSON line");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("scd-transport-bench"));  // stdout: results
  return scd::transport::Run(options);
}
