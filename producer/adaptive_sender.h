// AdaptiveSender: the producer's half of adapting a transfer to its link (codec/rank_governor.h).
// The forward pass hands it each layer's chunks at the plan's ranks and goes on computing; a
// thread of its own hands them to the transfer session in pieces of positions, each only once
// the link is ready for it (at most a window -- about 20 ms of the link's goodput, at least
// 32 KiB -- still queued on this side: handed to the transport and not yet let go of, so a
// consumer busy rebuilding between takes holds nothing up), and cuts each piece's codes to the
// nested rank the running budget
// allows at that moment. So a link that drops mid-layer is noticed within a window's drain, not
// after the layer, and the pass itself is never held by the link. Raw payloads and codes whose
// packing is not per position (int4 of a rank that is no multiple of 32) go whole with a layer's
// first piece. The consumer joins the pieces (codec/chunk_rows.h JoinMixedRankRows).
//
// Thread-safety: Push and Finish from one thread (the pass's); the sending thread is internal.
// The destructor stops the thread (after cancelling, a caller gets it back at once: a session
// that ended wakes every wait).
#ifndef SCD_PRODUCER_ADAPTIVE_SENDER_H_
#define SCD_PRODUCER_ADAPTIVE_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  // Waits until at most `bytes` are held or Stop was called; returns what is held then.
  size_t AwaitAtMost(size_t bytes);
  void Stop();

 private:
  mutable absl::Mutex mu_;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// Frames `chunk` and hands it to `session`; its bytes are counted in `held` and `queued` (either
// may be null) until the transport lets go of them. Adds the framed size to `*bytes`.
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

 private:
  struct Layer {
    int layer = 0;
    std::vector<CodeChunk> chunks;
  };
  void Run();
  absl::Status SendLayer(const Layer& layer);
  // Waits until the link is ready for the next piece and learns its goodput from the drain since
  // the last one; returns the bytes still queued on this side then.
  size_t AwaitLink();

  const std::shared_ptr<transport::SendSession> session_;
  const std::shared_ptr<ByteGauge> queued_ = std::make_shared<ByteGauge>();
  const Options options_;
  const int layers_;
  RankGovernor governor_;  // the sending thread's
  Report report_;          // the sending thread's until Finish
  absl::Time handed_ = absl::InfinitePast();
  size_t queued_after_ = 0;  // what this side held right after the last hand-over

  absl::Mutex mu_;
  std::deque<Layer> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // When the pass is expected to have made its last layer, at its pace so far.
  absl::Time compute_done_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace scd::producer

#endif  // SCD_PRODUCER_ADAPTIVE_SENDER_H_
