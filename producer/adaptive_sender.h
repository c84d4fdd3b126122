// AdaptiveSender: the producer's half of adapting a transfer to its link (codec/rank_governor.h).
// The forward pass hands it each layer's chunks at the plan's ranks and goes on computing; the
// sender hands them to the transfer session in pieces of positions, each only once the link is
// ready for it (at most a window -- about 20 ms of the link's goodput, at least 32 KiB -- still
// queued on this side: handed to the transport and not yet let go of, so a consumer busy
// rebuilding between takes holds nothing up), and cuts each piece's codes to the nested rank the
// running budget allows at that moment. So a link that drops mid-layer is noticed within a
// window's drain, not after the layer, and the pass itself is never held by the link. Raw
// payloads and codes whose packing is not per position (int4 of a rank that is no multiple of
// 32) go whole with a layer's first piece. The consumer joins the pieces (codec/chunk_rows.h
// JoinMixedRankRows).
//
// A sender holds no thread: it is a state object advanced by events -- a layer pushed, the bytes
// this side holds drained below the window (ByteGauge::OnAtMost), the session's credit made room
// (SendSession::OnRoomFor), a stop. Each step (one piece: slicing, lowering its ranks, the
// hand-over) runs as a job on Options::post; times come from Options::clock, so its policy runs
// on a simulated clock in tests.
//
// Thread-safety: Push and Finish from one thread (the pass's); steps never run concurrently.
// The destructor stops a sender that was not finished (cancelling its session) and waits for its
// last step.
#ifndef SCD_PRODUCER_ADAPTIVE_SENDER_H_
#define SCD_PRODUCER_ADAPTIVE_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/pending_call.h"
#include "codec/code_batch.h"
#include "codec/rank_governor.h"
#include "transport/transfer_session.h"

namespace scd::producer {

// Bytes handed to a transport that it has not yet let go of (queued at the shaper or in the
// backend's writer: not yet on the wire), and a wait for them to drain. Thread-safe.
class ByteGauge {
 public:
  void Add(size_t bytes);
  void Release(size_t bytes);
  size_t bytes() const;
  // Calls `ready` once, when at most `bytes` are held or Stop was called: at once (on the calling
  // thread) when that holds now, else on the thread whose Release or Stop makes it hold. A second
  // call replaces a pending `ready`, which must not block.
  void OnAtMost(size_t bytes, std::function<void()> ready);
  void Stop();

 private:
  // The parked OnAtMost's `ready` when its bound holds now (taken), else empty.
  std::function<void()> TakeReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  size_t at_most_ ABSL_GUARDED_BY(mu_) = 0;
  PendingCall ready_ ABSL_GUARDED_BY(mu_);
};

// A chunk framed for the transport, its bytes counted in `held` and `queued` (either may be
// null) until the transport lets go of them.
struct HeldFrame {
  v1::CodeChunk meta;
  transport::Payload payload;
  size_t bytes() const { return payload.size() + meta.scales().size(); }
};
HeldFrame FrameHeld(const CodeChunk& chunk, std::atomic<uint64_t>* held,
                    std::shared_ptr<ByteGauge> queued = nullptr);

// Frames `chunk` and hands it to `session` (FrameHeld). Adds the framed size to `*bytes`.
absl::Status SendCodeChunk(transport::SendSession& session, const CodeChunk& chunk,
                           std::atomic<uint64_t>* held, int64_t* bytes,
                           std::shared_ptr<ByteGauge> queued = nullptr);

class AdaptiveSender {
 public:
  struct Options {
    AdaptBudget budget;
    std::vector<LayerBytes> planned;  // per layer, at the plan's ranks
    absl::Time start;                 // the pass's
    std::atomic<uint64_t>* held_payload_bytes = nullptr;  // may be null
    size_t max_window = 0;  // the in-flight bound's cap; 0: 64 MiB (tests set a few hundred bytes)
    // Runs the sender's steps; null: the process's sending queue (SendingQueue()). Never the
    // pass's own queue: a pass waits in Finish for its sender's steps.
    std::function<void(std::function<void()>)> post;
    Clock* clock = nullptr;  // null: Clock::Real()
  };
  // What it sent, once Finish returned.
  struct Report {
    int64_t bytes = 0, chunks = 0;
    absl::Time first_chunk = absl::InfinitePast();
    std::vector<int> lowered;  // layers with a piece below the plan's ranks, ascending
  };

  AdaptiveSender(std::shared_ptr<transport::SendSession> session, Options options);
  ~AdaptiveSender();
  AdaptiveSender(const AdaptiveSender&) = delete;
  AdaptiveSender& operator=(const AdaptiveSender&) = delete;

  // Queues layer `layer`'s chunks (layers in ascending order). Returns why the sender stopped,
  // when it did (nothing more is sent then).
  absl::Status Push(int layer, std::vector<CodeChunk> chunks);
  // No more layers: waits until every queued piece is handed over or the sender stopped, and
  // returns why it stopped (OK: all handed over).
  absl::Status Finish();
  const Report& report() const { return report_; }

  // The in-flight bound at `goodput` bytes/s (0: unknown), at most `max_window` (0: 64 MiB).
  static size_t Window(double goodput, size_t max_window = 0);
  // The rows of a layer's next piece: half the window's bytes at `row_bytes` a position, at least
  // one, and the rest of the `left` positions when what would remain is under half a piece.
  static int64_t PieceRows(size_t window, int64_t row_bytes, int64_t left);
  // The queue every sender of the process runs its steps on unless told otherwise (2 threads
  // named scd-send, made at first use, never destroyed; a service calls it at start so that its
  // threads are all there before the first request).
  static std::function<void(std::function<void()>)> SendingQueue();

 private:
  class Core;
  const std::shared_ptr<Core> core_;
  Report report_;  // copied from the core when it ended
};

}  // namespace scd::producer

#endif  // SCD_PRODUCER_ADAPTIVE_SENDER_H_
