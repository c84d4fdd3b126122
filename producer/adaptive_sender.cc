#include "producer/adaptive_sender.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "base/status_macros.h"
#include "base/work_queue.h"
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
    if (held_ != nullptr) {
      held_->fetch_add(size_);
      NoteChange();  // NodeStats.held_payload_bytes moved
    }
    if (queued_ != nullptr) queued_->Add(size_);
  }
  ~HeldChunk() {
    if (held_ != nullptr) {
      held_->fetch_sub(size_);
      NoteChange();
    }
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

std::function<void()> ByteGauge::TakeReadyLocked() {
  return ready_.TakeIf(stopped_ || bytes_ <= at_most_);
}

void ByteGauge::Release(size_t bytes) {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    bytes_ -= std::min(bytes_, bytes);
    ready = TakeReadyLocked();
  }
  if (ready) ready();
}

size_t ByteGauge::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void ByteGauge::OnAtMost(size_t bytes, std::function<void()> ready) {
  {
    absl::MutexLock lock(&mu_);
    at_most_ = bytes;
    ready_.Park(std::move(ready));
    ready = TakeReadyLocked();
  }
  if (ready) ready();
}

void ByteGauge::Stop() {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    ready = TakeReadyLocked();
  }
  if (ready) ready();
}

HeldFrame FrameHeld(const CodeChunk& chunk, std::atomic<uint64_t>* held,
                    std::shared_ptr<ByteGauge> queued) {
  FramedChunk framed = FrameChunk(chunk);
  if (held != nullptr || queued != nullptr) {
    framed.owner = std::make_shared<HeldChunk>(std::move(framed.owner), framed.size, held,
                                               std::move(queued));
  }
  return {std::move(framed.meta),
          transport::Payload(framed.data, framed.size, std::move(framed.owner))};
}

absl::Status SendCodeChunk(transport::SendSession& session, const CodeChunk& chunk,
                           std::atomic<uint64_t>* held, int64_t* bytes,
                           std::shared_ptr<ByteGauge> queued) {
  HeldFrame frame = FrameHeld(chunk, held, std::move(queued));
  *bytes += static_cast<int64_t>(frame.payload.size());
  return session.SendChunk(std::move(frame.meta), std::move(frame.payload));
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

int64_t AdaptiveSender::PieceRows(size_t window, int64_t row_bytes, int64_t left) {
  if (row_bytes <= 0) return left;
  const int64_t fit = static_cast<int64_t>(window / 2) / row_bytes;
  int64_t rows = std::clamp<int64_t>(fit, 1, left);
  if (left - rows < rows / 2) rows = left;  // no runt last piece
  return rows;
}

std::function<void(std::function<void()>)> AdaptiveSender::SendingQueue() {
  static WorkQueue* const queue =
      new WorkQueue(2, "scd-send");  // never destroyed: senders of any lifetime
  return [](std::function<void()> job) { queue->Run(std::move(job)); };
}

// The sender's state (see the header). Steps run one at a time: `active_` says one is posted or
// waiting on an event, and only the step in progress arms the next.
class AdaptiveSender::Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::shared_ptr<transport::SendSession> session, Options options)
      : session_(std::move(session)),
        options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
        post_(options_.post ? options_.post : SendingQueue()),
        layers_(static_cast<int>(options_.planned.size())),
        governor_(options_.budget, options_.planned, options_.start) {}

  absl::Status Push(int layer, std::vector<CodeChunk> chunks);
  // No more layers (Finish).
  void Close();
  // Stops sending: the session cancelled, every wait woken.
  void Stop();
  // Waits until the last step ended; returns why it stopped and what it sent.
  absl::Status AwaitEnd(Report* report);

 private:
  struct Layer {
    int layer = 0;
    std::vector<CodeChunk> chunks;
  };
  // Where a layer's hand-over stands: its codes cut in pieces of positions [begin, end), the
  // rest whole with the first piece.
  struct Progress {
    Layer layer;
    std::vector<size_t> pieced, whole;  // indices into layer.chunks
    int64_t begin = 0, end = 0, pos = 0, row_bytes = 0;
    int piece = 0;
    bool lowered = false;
  };
  static Progress Begin(Layer layer);
  // Schedules a step unless one is scheduled or the sender ended; true when the caller must post.
  bool KickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Post();
  void Step();
  // Cuts the layer's next piece at the rank the budget allows now into pending_.
  absl::Status MakePiece(absl::Time compute_done);
  // Hands the pending piece over as the session has room; false when it waits for credit.
  bool HandOver();
  void End(absl::Status status);

  const std::shared_ptr<transport::SendSession> session_;
  const std::shared_ptr<ByteGauge> queued_ = std::make_shared<ByteGauge>();
  const Options options_;
  Clock* const clock_;
  const std::function<void(std::function<void()>)> post_;
  const int layers_;
  // The steps' own (one at a time).
  RankGovernor governor_;
  Report report_;
  absl::Time handed_ = absl::InfinitePast();
  size_t queued_after_ = 0;  // what this side held right after the last hand-over
  std::optional<Progress> progress_;
  std::deque<HeldFrame> pending_;  // the piece being handed over
  int64_t pending_rows_ = 0;
  bool handing_over_ = false;  // pending_'s hand-over began (maybe waiting for credit)

  absl::Mutex mu_;
  std::deque<Layer> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // When the pass is expected to have made its last layer, at its pace so far.
  absl::Time compute_done_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

bool AdaptiveSender::Core::KickLocked() {
  if (active_ || ended_) return false;
  active_ = true;
  return true;
}

void AdaptiveSender::Core::Post() {
  std::shared_ptr<Core> self = shared_from_this();
  post_([self] { self->Step(); });
}

absl::Status AdaptiveSender::Core::Push(int layer, std::vector<CodeChunk> chunks) {
  bool post = false;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    if (closed_) return absl::FailedPreconditionError("a layer pushed after Finish");
    const absl::Time now = clock_->Now();
    compute_done_ = now + (now - options_.start) / (layer + 1) * std::max(0, layers_ - layer - 1);
    queue_.push_back(Layer{layer, std::move(chunks)});
    post = KickLocked();
  }
  if (post) Post();
  return absl::OkStatus();
}

void AdaptiveSender::Core::Close() {
  bool post = false;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    compute_done_ = clock_->Now();  // every layer is made
    post = KickLocked();
  }
  if (post) Post();
}

void AdaptiveSender::Core::Stop() {
  bool post = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    stop_ = true;
    post = KickLocked();
  }
  // A wait on the link ends with the session (its queued frames are dropped) or the gauge.
  session_->Abort("the producer stopped before its codes were sent");
  queued_->Stop();
  if (post) Post();
}

absl::Status AdaptiveSender::Core::AwaitEnd(Report* report) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&ended_));
  *report = report_;
  return status_;
}

void AdaptiveSender::Core::End(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (status_.ok()) status_ = std::move(status);
  queue_.clear();
  pending_.clear();
  ended_ = true;
  active_ = false;
}

AdaptiveSender::Core::Progress AdaptiveSender::Core::Begin(Layer layer) {
  Progress p;
  p.layer = std::move(layer);
  const std::vector<CodeChunk>& chunks = p.layer.chunks;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const CodeChunk& chunk = chunks[i];
    const bool cut = Pieceable(chunk) &&
                     (p.pieced.empty() || (chunk.token_begin == chunks[p.pieced[0]].token_begin &&
                                           chunk.token_end == chunks[p.pieced[0]].token_end));
    (cut ? p.pieced : p.whole).push_back(i);
  }
  p.begin = p.pieced.empty() ? 0 : chunks[p.pieced[0]].token_begin;
  p.end = p.pieced.empty() ? 0 : chunks[p.pieced[0]].token_end;
  p.pos = p.begin;
  for (size_t i : p.pieced) p.row_bytes += chunks[i].bytes() / (p.end - p.begin);
  return p;
}

void AdaptiveSender::Core::Step() {
  enum class Next { kPiece, kIdle, kStopped, kDone } next = Next::kPiece;
  absl::Time compute_done;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      next = Next::kStopped;
    } else if (!progress_.has_value() && queue_.empty()) {
      next = closed_ ? Next::kDone : Next::kIdle;
      if (next == Next::kIdle) active_ = false;  // until the next Push
    } else if (!progress_.has_value()) {
      progress_ = Begin(std::move(queue_.front()));
      queue_.pop_front();
    }
    compute_done = compute_done_;
  }
  if (next == Next::kIdle) return;
  if (next == Next::kStopped) return End(absl::CancelledError("the producer stopped sending"));
  if (next == Next::kDone) return End(absl::OkStatus());  // closed, all handed over
  std::shared_ptr<Core> self = shared_from_this();
  if (pending_.empty()) {
    // What this side still holds, not what the consumer has yet to take: a consumer rebuilding a
    // layer between takes leaves the link free, and its pace is not the link's. (Over the
    // in-process backend, which hands the payload itself to the receiver, the two are one.)
    const size_t window = Window(governor_.goodput(), options_.max_window);
    if (queued_->bytes() > window) return queued_->OnAtMost(window, [self] { self->Post(); });
    if (absl::Status made = MakePiece(compute_done); !made.ok()) return End(made);
  }
  if (!HandOver()) return;  // waits for credit, or ended
  Post();  // the next piece: a job of its own, so the senders on the queue take turns
}

absl::Status AdaptiveSender::Core::MakePiece(absl::Time compute_done) {
  Progress& p = *progress_;
  const size_t inflight = queued_->bytes();
  const absl::Time now = clock_->Now();
  // Bytes still in flight: the link was busy since the last hand-over, so what drained is its rate.
  if (handed_ != absl::InfinitePast() && inflight > 0 && queued_after_ > inflight) {
    governor_.ObserveDrain(static_cast<int64_t>(queued_after_ - inflight), now - handed_);
  }
  const double share_left =
      p.pieced.empty() ? 1.0
                       : static_cast<double>(p.end - p.pos) / static_cast<double>(p.end - p.begin);
  const double scale = governor_.ScaleFor(p.layer.layer, now, static_cast<int64_t>(inflight),
                                          compute_done, share_left);
  const int64_t rows =
      PieceRows(Window(governor_.goodput(), options_.max_window), p.row_bytes, p.end - p.pos);
  std::vector<CodeChunk> out;
  const std::vector<CodeChunk>& chunks = p.layer.chunks;
  if (p.piece == 0) {
    for (size_t i : p.whole) out.push_back(chunks[i]);
  }
  for (size_t i : p.pieced) {
    if (rows == p.end - p.begin) {
      out.push_back(chunks[i]);
    } else {
      SCD_ASSIGN_OR_RETURN(CodeChunk rows_chunk, SliceChunkRows(chunks[i], p.pos, p.pos + rows));
      out.push_back(std::move(rows_chunk));
    }
  }
  for (CodeChunk& chunk : out) {
    if (!IsCodeKind(chunk.kind) || chunk.shape.empty()) continue;
    const int64_t rank = RankGovernor::ScaledRank(chunk.shape.back(), scale);
    if (rank == chunk.shape.back()) continue;
    SCD_ASSIGN_OR_RETURN(chunk, LowerChunkRank(chunk, rank));
    p.lowered = true;
  }
  for (const CodeChunk& chunk : out) {
    pending_.push_back(FrameHeld(chunk, options_.held_payload_bytes, queued_));
  }
  pending_rows_ = rows;
  return absl::OkStatus();
}

bool AdaptiveSender::Core::HandOver() {
  if (!handing_over_) {
    // The hand-over's moment and what this side holds with the piece (counted since it was
    // framed): the drain the next piece measures starts here.
    handing_over_ = true;
    handed_ = clock_->Now();
    queued_after_ = queued_->bytes();
  }
  while (!pending_.empty()) {
    HeldFrame& frame = pending_.front();
    if (!session_->HasRoomFor(frame.bytes())) {
      std::shared_ptr<Core> self = shared_from_this();
      session_->OnRoomFor(frame.bytes(), [self] { self->Post(); });
      return false;
    }
    if (report_.chunks == 0) report_.first_chunk = clock_->Now();
    ++report_.chunks;
    report_.bytes += static_cast<int64_t>(frame.payload.size());
    absl::Status sent = session_->SendChunk(std::move(frame.meta), std::move(frame.payload));
    pending_.pop_front();
    if (!sent.ok()) {
      End(sent);
      return false;
    }
  }
  handing_over_ = false;
  Progress& p = *progress_;
  p.pos += pending_rows_;
  ++p.piece;
  if (p.pos >= p.end) {  // the layer is handed over (one with no pieced code: in its first piece)
    if (p.lowered) report_.lowered.push_back(p.layer.layer);
    progress_.reset();
  }
  return true;
}

AdaptiveSender::AdaptiveSender(std::shared_ptr<transport::SendSession> session, Options options)
    : core_(std::make_shared<Core>(std::move(session), std::move(options))) {}

AdaptiveSender::~AdaptiveSender() {
  core_->Stop();  // nothing when it ended already (Finish)
  core_->AwaitEnd(&report_).IgnoreError();
}

absl::Status AdaptiveSender::Push(int layer, std::vector<CodeChunk> chunks) {
  return core_->Push(layer, std::move(chunks));
}

absl::Status AdaptiveSender::Finish() {
  core_->Close();
  return core_->AwaitEnd(&report_);
}

}  // namespace scd::producer
