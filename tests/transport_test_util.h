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
#include "absl/time/time.h"
#include "transport/fault_injection.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::testing {

class FrameRecorder : public transport::LinkHandler {
 public:
  void OnFrame(transport::Frame frame) override;
  void OnLinkDown(absl::Status status) override;

  // Waits until at least `count` frames arrived (true) or `timeout` passed (false).
  bool WaitForFrames(size_t count, absl::Duration timeout);
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
