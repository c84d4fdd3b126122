#include "tests/transport_test_util.h"

#include <gtest/gtest.h>

namespace scd::testing {

void FrameRecorder::OnFrame(transport::Frame frame) {
  absl::MutexLock lock(&mu_);
  frames_.push_back(std::move(frame));
}

void FrameRecorder::OnLinkDown(absl::Status status) {
  absl::MutexLock lock(&mu_);
  ++down_calls_;
  if (!down_) down_ = std::move(status);
}

bool FrameRecorder::WaitForFrames(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

std::optional<absl::Status> FrameRecorder::WaitForLinkDown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto down = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return down_.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&down), timeout);
  return down_;
}

std::vector<transport::Frame> FrameRecorder::TakeFrames() {
  absl::MutexLock lock(&mu_);
  std::vector<transport::Frame> out;
  out.swap(frames_);
  return out;
}

size_t FrameRecorder::frame_count() {
  absl::MutexLock lock(&mu_);
  return frames_.size();
}

int FrameRecorder::link_down_calls() {
  absl::MutexLock lock(&mu_);
  return down_calls_;
}

transport::Frame MakeFrame(transport::FrameType type, uint64_t session, std::string meta,
                           const std::string& bytes) {
  transport::Frame frame;
  frame.type = type;
  frame.session_id = session;
  frame.meta = std::move(meta);
  if (!bytes.empty()) frame.payload = transport::Payload::Copy(bytes.data(), bytes.size());
  return frame;
}

std::string PatternBytes(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

SessionPeers ConnectSessions(const std::string& backend,
                             transport::ConnectionOptions receiver_options,
                             transport::ConnectionOptions sender_options,
                             transport::FaultPolicy policy) {
  SessionPeers peers;
  transport::TransportOptions options;
  options.backend = backend;
  auto transport = transport::CreateTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  if (!transport.ok()) return peers;
  peers.transport = *std::move(transport);
  auto listener = peers.transport->Listen(backend == "inproc" ? "test:0" : "127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return peers;
  const std::string address = (*listener)->address();
  peers.acceptor =
      std::make_unique<transport::SessionAcceptor>(*std::move(listener), receiver_options);
  auto link = peers.transport->Connect(address, absl::Seconds(5));
  EXPECT_TRUE(link.ok()) << link.status();
  if (!link.ok()) return peers;
  auto faulty =
      std::make_unique<transport::FaultInjectingLink>(*std::move(link), std::move(policy));
  peers.sender_faults = faulty.get();
  peers.sender = transport::TransferConnection::Create(std::move(faulty), sender_options);
  return peers;
}

}  // namespace scd::testing
