// Shared helpers for transport tests (torch-free): a LinkHandler that records what arrives, and
// frame builders.
// Thread-safety: FrameRecorder is thread-safe.
#ifndef SCD_TESTS_TRANSPORT_TEST_UTIL_H_
#define SCD_TESTS_TRANSPORT_TEST_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

}  // namespace scd::testing

#endif  // SCD_TESTS_TRANSPORT_TEST_UTIL_H_
