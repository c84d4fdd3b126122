#include "producer/adaptive_sender.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "codec/chunk_rows.h"
#include "proto/code_chunk_framing.h"

namespace scd::producer {
namespace {

// Keeps a chunk's bytes alive while the transport holds them, counted in `held` and `queued`
// (either may be null).
class HeldChunk {
 public:
  HeldChunk(std::shared_ptr<const void> owner, uint64_t size, std::atomic<uint64_t>* held,
            std::shared_ptr<ByteGauge> queued)
      : owner_(std::move(owner)), size_(size), held_(held), queued_(std::move(queued)) {
    if (held_ != nullptr) held_->fetch_add(size_);
    if (queued_ != nullptr) queued_->Add(size_);
  }
  ~HeldChunk() {
    if (held_ != nullptr) held_->fetch_sub(size_);
    if (queued_ != nullptr) queued_->Release(size_);
  }
  HeldChunk(const HeldChunk&) = delete;
  HeldChunk& operator=(const HeldChunk&) = delete;

 private:
  std::shared_ptr<const void> owner_;
  const uint64_t size_;
  std::atomic<uint64_t>* const held_;
  const std::shared_ptr<ByteGauge> queued_;
};

// The link time the in-flight window holds: long enough that waking to hand the next piece over
// never leaves the link idle, short enough that a drop commits little at the old rate.
constexpr absl::Duration kWindowTime = absl::Milliseconds(20);
constexpr size_t kMinWindow = size_t{32} << 10;
constexpr size_t kUnknownWindow = size_t{1} << 20;
constexpr size_t kMaxWindow = size_t{64} << 20;

// Whether `chunk` goes in pieces of positions: a code packed per position over its whole range.
bool Pieceable(const CodeChunk& chunk) {
  return IsCodeKind(chunk.kind) && RowSeparable(chunk.dtype, chunk.shape) &&
         chunk.shape[chunk.shape.size() - 2] == chunk.token_end - chunk.token_begin;
}

}  // namespace

void ByteGauge::Add(size_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ += bytes;
}

void ByteGauge::Release(size_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ -= std::min(bytes_, bytes);
}

size_t ByteGauge::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t ByteGauge::AwaitAtMost(size_t bytes) {
  absl::MutexLock lock(&mu_);
  auto drained = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || bytes_ <= bytes;
  };
  mu_.Await(absl::Condition(&drained));
  return bytes_;
}

void ByteGauge::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

absl::Status SendCodeChunk(transport::SendSession& session, const CodeChunk& chunk,
                           std::atomic<uint64_t>* held, int64_t* bytes,
                           std::shared_ptr<ByteGauge> queued) {
  FramedChunk framed = FrameChunk(chunk);
  *bytes += static_cast<int64_t>(framed.size);
  if (held != nullptr || queued != nullptr) {
    framed.owner = std::make_shared<HeldChunk>(std::move(framed.owner), framed.size, held,
                                               std::move(queued));
  }
  return session.SendChunk(std::move(framed.meta),
                           transport::Payload(framed.data, framed.size, std::move(framed.owner)));
}

size_t AdaptiveSender::Window(double goodput, size_t max_window) {
  if (max_window == 0) max_window = kMaxWindow;
  size_t window = kUnknownWindow;
  if (goodput > 0) {
    const double bytes = goodput * absl::ToDoubleSeconds(kWindowTime);
    window = bytes < static_cast<double>(kMaxWindow) ? std::max(kMinWindow, static_cast<size_t>(bytes))
                                                     : kMaxWindow;
  }
  return std::min(window, max_window);
}

AdaptiveSender::AdaptiveSender(std::shared_ptr<transport::SendSession> session, Options options)
    : session_(std::move(session)),
      options_(std::move(options)),
      layers_(static_cast<int>(options_.planned.size())),
      governor_(options_.budget, options_.planned, options_.start) {
  thread_ = std::thread([this] {
    NameThisThread("scd-adaptive");
    Run();
  });
}

AdaptiveSender::~AdaptiveSender() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // A wait on the link ends with the session (its queued frames are dropped) or here.
  session_->Cancel("the producer stopped before its codes were sent");
  queued_->Stop();
  thread_.join();
}

absl::Status AdaptiveSender::Push(int layer, std::vector<CodeChunk> chunks) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  if (closed_) return absl::FailedPreconditionError("a layer pushed after Finish");
  const absl::Time now = absl::Now();
  compute_done_ = now + (now - options_.start) / (layer + 1) * std::max(0, layers_ - layer - 1);
  queue_.push_back(Layer{layer, std::move(chunks)});
  return absl::OkStatus();
}

absl::Status AdaptiveSender::Finish() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    compute_done_ = absl::Now();  // every layer is made
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return status_;
}

void AdaptiveSender::Run() {
  for (;;) {
    Layer layer;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || closed_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) {
        if (status_.ok()) status_ = absl::CancelledError("the producer stopped sending");
        return;
      }
      if (queue_.empty()) return;  // closed, all handed over
      layer = std::move(queue_.front());
      queue_.pop_front();
    }
    if (absl::Status sent = SendLayer(layer); !sent.ok()) {
      absl::MutexLock lock(&mu_);
      status_ = sent;
      queue_.clear();
      return;
    }
  }
}

size_t AdaptiveSender::AwaitLink() {
  // What this side still holds, not what the consumer has yet to take: a consumer rebuilding a
  // layer between takes leaves the link free, and its pace is not the link's. (Over the
  // in-process backend, which hands the payload itself to the receiver, the two are one.)
  const size_t inflight = queued_->AwaitAtMost(Window(governor_.goodput(), options_.max_window));
  const absl::Time now = absl::Now();
  // Bytes still in flight: the link was busy since the last hand-over, so what drained is its rate.
  if (handed_ != absl::InfinitePast() && inflight > 0 && queued_after_ > inflight) {
    governor_.ObserveDrain(static_cast<int64_t>(queued_after_ - inflight), now - handed_);
  }
  return inflight;
}

absl::Status AdaptiveSender::SendLayer(const Layer& l) {
  std::vector<const CodeChunk*> pieced, whole;
  int64_t piece_row_bytes = 0;
  for (const CodeChunk& chunk : l.chunks) {
    const bool cut = Pieceable(chunk) && (pieced.empty() ||
                                          (chunk.token_begin == pieced[0]->token_begin &&
                                           chunk.token_end == pieced[0]->token_end));
    (cut ? pieced : whole).push_back(&chunk);
  }
  const int64_t begin = pieced.empty() ? 0 : pieced[0]->token_begin;
  const int64_t end = pieced.empty() ? 0 : pieced[0]->token_end;
  for (const CodeChunk* chunk : pieced) piece_row_bytes += chunk->bytes() / (end - begin);
  bool lowered = false;
  for (int64_t pos = begin, piece = 0; piece == 0 || pos < end; ++piece) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::CancelledError("the producer stopped sending");
    }
    const size_t inflight = AwaitLink();
    absl::Time compute_done;
    {
      absl::MutexLock lock(&mu_);
      compute_done = compute_done_;
    }
    const double share_left =
        pieced.empty() ? 1.0 : static_cast<double>(end - pos) / static_cast<double>(end - begin);
    const double scale = governor_.ScaleFor(l.layer, absl::Now(), static_cast<int64_t>(inflight),
                                            compute_done, share_left);
    int64_t rows = end - pos;
    if (piece_row_bytes > 0) {
      const int64_t fit =
          static_cast<int64_t>(Window(governor_.goodput(), options_.max_window) / 2) / piece_row_bytes;
      rows = std::clamp<int64_t>(fit, 1, end - pos);
      if (end - pos - rows < rows / 2) rows = end - pos;  // no runt last piece
    }
    std::vector<CodeChunk> out;
    if (piece == 0) {
      for (const CodeChunk* chunk : whole) out.push_back(*chunk);
    }
    for (const CodeChunk* chunk : pieced) {
      if (rows == end - begin) {
        out.push_back(*chunk);
      } else {
        SCD_ASSIGN_OR_RETURN(CodeChunk rows_chunk, SliceChunkRows(*chunk, pos, pos + rows));
        out.push_back(std::move(rows_chunk));
      }
    }
    for (CodeChunk& chunk : out) {
      if (!IsCodeKind(chunk.kind) || chunk.shape.empty()) continue;
      const int64_t rank = RankGovernor::ScaledRank(chunk.shape.back(), scale);
      if (rank == chunk.shape.back()) continue;
      SCD_ASSIGN_OR_RETURN(chunk, LowerChunkRank(chunk, rank));
      lowered = true;
    }
    for (const CodeChunk& chunk : out) {
      if (report_.chunks == 0) report_.first_chunk = absl::Now();
      ++report_.chunks;
      SCD_RETURN_IF_ERROR(
          SendCodeChunk(*session_, chunk, options_.held_payload_bytes, &report_.bytes, queued_));
    }
    handed_ = absl::Now();
    queued_after_ = queued_->bytes();
    pos += rows;
  }
  if (lowered) report_.lowered.push_back(l.layer);
  return absl::OkStatus();
}

}  // namespace scd::producer
