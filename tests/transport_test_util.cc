#include "tests/transport_test_util.h"

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

}  // namespace scd::testing
