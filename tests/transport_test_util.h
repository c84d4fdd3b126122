// Shared helpers for transport tests (torch-free): a LinkHandler that records what arrives, frame
// builders, and a connected sender/receiver pair of transfer sessions on one backend.
// Thread-safety: FrameRecorder is thread-safe.
#ifndef SCD_TESTS_TRANSPORT_TEST_UTIL_H_
#define SCD_TESTS_TRANSPORT_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "transport/fault_injection.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::testing {

class FrameRecorder : public transport::LinkHandler {
 public:
  void OnFrame(transport::Frame frame) override;
  void OnLinkDown(absl::Status status) override;

  // Waits until at least `count` frames arrived (true) or `timeout` passed (false).
  bool WaitForFrames(size_t count, absl::Duration timeout);
  // Waits until a frame of `session` arrived (true) or `timeout` passed (false).
  bool WaitForSession(uint64_t session, absl::Duration timeout);
  // Waits for OnLinkDown; nullopt on timeout.
  std::optional<absl::Status> WaitForLinkDown(absl::Duration timeout);
  std::vector<transport::Frame> TakeFrames();
  size_t frame_count();
  int link_down_calls();

 private:
  absl::Mutex mu_;
  std::vector<transport::Frame> frames_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> down_ ABSL_GUARDED_BY(mu_);
  int down_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A frame of `type` for `session` whose meta is `meta` and payload a counted copy of `bytes`.
transport::Frame MakeFrame(transport::FrameType type, uint64_t session, std::string meta,
                           const std::string& bytes = "");
// `n` bytes of a deterministic pattern seeded by `seed`.
std::string PatternBytes(size_t n, uint32_t seed);

// Frames every backend can carry (their meta a TransferFrame of their type, as the gRPC backend
// requires). A header for `chunks` chunks whose request id is `id_bytes` long (UCX sends a meta
// too large for an AM header inside the AM data).
transport::Frame ValidHeader(uint64_t session, uint64_t chunks, size_t id_bytes = 8);
transport::Frame ValidChunk(uint64_t session, uint32_t index, transport::Payload payload);
transport::Frame ValidTrailer(uint64_t session, uint64_t chunks, uint64_t bytes);
// A control frame of `type` whose meta carries `value`, so that every one is distinct.
transport::Frame ValidControl(transport::FrameType type, uint64_t session, uint64_t value);

// What one direction of a link sends in the contract tests: 4 sessions of a header, 48 chunks of
// 0 B .. 8 MiB (around UCX's eager/rendezvous threshold and gRPC's message limit) and a trailer,
// plus 40 control frames of every kind, with the payload bytes kept for checking.
struct FrameScript {
  std::vector<transport::Frame> data;
  std::vector<std::string> payloads;  // per data frame, "" for non-chunks
  std::vector<transport::Frame> control;
  size_t frames() const { return data.size() + control.size(); }
};
FrameScript MakeFrameScript(uint32_t seed);
// Sends copies of the script's frames, a control frame after every 5 data frames.
void SendFrameScript(transport::Link* link, const FrameScript& script);
// Data frames in order with exact meta and bytes; every control frame once, in any place.
void CheckFrameScript(std::vector<transport::Frame> got, const FrameScript& script);
// LiveTransportBuffers() once backends' threads let go of the last buffers (a wait of at most 2 s,
// woken by each release).
int64_t SettledLiveBuffers();

// Bytes a test sends, as one counted buffer whose release is an event: every View shares it, and
// AwaitReleased says when the transport let go of the last one (instead of polling a count).
class WatchedBytes {
 public:
  explicit WatchedBytes(std::string bytes);
  transport::Payload View() const { return view_; }
  // Drops the test's own view; whether the transport let go of every other within `timeout`.
  bool AwaitReleased(absl::Duration timeout);
  size_t size() const { return bytes_->size(); }

 private:
  std::shared_ptr<std::string> bytes_;
  std::shared_ptr<absl::Notification> released_;
  transport::Payload view_;
};

// A receiver (acceptor) and a sender connection on one backend (loopback, or in-process), the
// sender's link wrapped in a fault injector with `policy`. Members are destroyed in reverse order:
// the connection before the acceptor before the transport.
struct SessionPeers {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::SessionAcceptor> acceptor;
  std::shared_ptr<transport::TransferConnection> sender;
  transport::FaultInjectingLink* sender_faults = nullptr;  // owned by `sender`
};
SessionPeers ConnectSessions(const std::string& backend,
                             transport::ConnectionOptions receiver_options = {},
                             transport::ConnectionOptions sender_options = {},
                             transport::FaultPolicy policy = {});

}  // namespace scd::testing

#endif  // SCD_TESTS_TRANSPORT_TEST_UTIL_H_
