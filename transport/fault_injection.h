// Fault injection: a Link wrapper that drops, delays, corrupts, disconnects or freezes by policy,
// so every transport and service test can provoke the failures real links have. Wrap either end;
// rules match frames going out (Send) or coming in (delivered to the handler).
//
//   kDrop        the matching frame vanishes
//   kDelay       the matching frame is held for `delay` (later frames are not held)
//   kCorrupt     one byte of the matching chunk's payload is flipped (a copy; the sender's bytes
//                stay intact)
//   kDisconnect  the link closes at the matching frame
//   kFreeze      from the matching frame on, nothing goes out and nothing is delivered, and the
//                link stays up: a frozen peer or a silent network
// Thread-safety: thread-safe like any Link.
#ifndef SCD_TRANSPORT_FAULT_INJECTION_H_
#define SCD_TRANSPORT_FAULT_INJECTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "transport/link_wrapper.h"
#include "transport/transport.h"

namespace scd::transport {

enum class FaultAction { kDrop, kDelay, kCorrupt, kDisconnect, kFreeze };
enum class FaultDirection { kOutgoing, kIncoming };

struct FaultRule {
  FaultAction action = FaultAction::kDrop;
  FaultDirection direction = FaultDirection::kOutgoing;
  std::optional<FrameType> type;  // nullopt: any frame
  int64_t nth = 0;                // the rule fires on the nth matching frame (0-based)...
  int64_t count = 1;              // ...and the next count-1 (kFreeze/kDisconnect: once is enough)
  absl::Duration delay = absl::ZeroDuration();
  size_t corrupt_offset = 0;  // byte of the payload to flip (modulo its size)
};

struct FaultPolicy {
  std::vector<FaultRule> rules;
};

// Counts of what the wrapper did, for assertions.
struct FaultCounters {
  int64_t dropped = 0, delayed = 0, corrupted = 0, disconnects = 0, frozen_frames = 0;
};

// A LinkWrapper: what it does not change (DropSession) reaches the wrapped link.
class FaultInjectingLink : public LinkWrapper, private LinkHandler {
 public:
  FaultInjectingLink(std::unique_ptr<Link> inner, FaultPolicy policy);
  ~FaultInjectingLink() override;

  void Start(LinkHandler* handler) override;
  absl::Status Send(Frame frame) override;
  void Close() override;
  std::string Describe() const override;

  FaultCounters counters() const;
  // Freezes / thaws the link now (as a kFreeze rule would).
  void SetFrozen(bool frozen);

 private:
  struct State;
  void OnFrame(Frame frame) override;
  void OnLinkDown(absl::Status status) override;

  std::shared_ptr<State> state_;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_FAULT_INJECTION_H_
