#include "consumer/code_receiver.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "codec/chunk_rows.h"
#include "codec/layerwise_rebuilder.h"
#include "proto/code_chunk_framing.h"

namespace scd::consumer {
namespace {

// Why `header` is not the transfer this consumer expects ("" when it is).
std::string HeaderMismatch(const v1::TransferHeader& header, const TransferPlan& plan,
                           const std::vector<PlannedChunk>& expected, int64_t tokens, int64_t begin,
                           int layer_begin) {
  absl::StatusOr<TransferMode> mode = ModeFromProto(header.mode());
  if (!mode.ok()) return std::string(mode.status().message());
  if (*mode != plan.mode) {
    return absl::StrCat("the producer sends mode ", TransferModeName(*mode), ", expected ",
                        TransferModeName(plan.mode));
  }
  if (header.tokens() != static_cast<uint64_t>(tokens)) {
    return absl::StrCat("the producer sends ", header.tokens(), " positions, the prompt has ",
                        tokens);
  }
  if (header.token_begin() != static_cast<uint64_t>(begin)) {
    return absl::StrCat("the producer sends positions from ", header.token_begin(),
                        ", this consumer holds [0, ", begin, ") and expects the rest");
  }
  if (header.layer_begin() != static_cast<uint32_t>(layer_begin)) {
    return absl::StrCat("the producer sends layers from ", header.layer_begin(),
                        ", this consumer has rebuilt layers [0, ", layer_begin,
                        ") and expects the rest");
  }
  const int64_t bytes = TotalBytes(expected);
  if (header.expected_chunks() != expected.size() ||
      header.expected_bytes() != static_cast<uint64_t>(bytes)) {
    return absl::StrCat("the producer announces ", header.expected_chunks(), " chunks / ",
                        header.expected_bytes(), " bytes, this consumer's plan ", expected.size(),
                        " / ", bytes, " (different artifact or options?)");
  }
  return "";
}

// Why `chunk` is not one `expected` holds ("" when it is): the same layer, kind and dtype, the same
// shape but for a code's rank, which under an adaptive header may be lower. Sets `lowered_rank`
// to the rank that arrived when it is below the plan's (else 0).
std::string ChunkMismatch(const CodeChunk& chunk, const std::vector<PlannedChunk>& expected,
                          bool adaptive, int64_t* lowered_rank) {
  *lowered_rank = 0;
  const std::string what = absl::StrCat(PayloadKindName(chunk.kind), " of layer ", chunk.layer);
  auto planned = std::find_if(expected.begin(), expected.end(), [&](const PlannedChunk& p) {
    return p.layer == chunk.layer && p.kind == chunk.kind;
  });
  if (planned == expected.end()) return absl::StrCat("the plan sends no ", what);
  if (planned->dtype != chunk.dtype) {
    return absl::StrCat(what, " arrives as ", WireDtypeName(chunk.dtype), ", the plan's is ",
                        WireDtypeName(planned->dtype));
  }
  const bool code = IsCodeKind(chunk.kind);
  const std::vector<int64_t>& want = planned->shape;
  bool same = chunk.shape.size() == want.size() && want.size() >= 2;
  for (size_t d = 0; same && d + 1 < want.size(); ++d) {
    // An adapting producer may send a code in pieces of positions.
    const bool rows = d + 2 == want.size() && adaptive && code;
    same = chunk.shape[d] == (rows ? chunk.token_end - chunk.token_begin : want[d]);
  }
  if (same && chunk.shape.back() != want.back()) {
    same = adaptive && code && chunk.shape.back() >= 1 && chunk.shape.back() < want.back();
    if (same) *lowered_rank = chunk.shape.back();
  }
  if (!same) {
    return absl::StrCat(what, " has shape [", absl::StrJoin(chunk.shape, ", "), "], the plan's [",
                        absl::StrJoin(want, ", "), "]",
                        adaptive && code ? " (a lower rank at most)" : "");
  }
  return "";
}

// Records a code that arrived at `rank`, below the plan's, in `report.lowered`.
void NoteLowered(const CodeChunk& chunk, int64_t rank, ReceiveReport* report) {
  if (report->lowered.empty() || report->lowered.back().layer != chunk.layer) {
    report->lowered.push_back({chunk.layer});
  }
  LoweredLayer& layer = report->lowered.back();
  int64_t& lowest = chunk.kind == PayloadKind::kKeyCode     ? layer.rank_k
                    : chunk.kind == PayloadKind::kValueCode ? layer.rank_v
                                                            : layer.rank_h;
  lowest = lowest == 0 ? rank : std::min(lowest, rank);  // pieces may differ: the lowest
  report->lowered_pieces.push_back({chunk.layer, chunk.kind, chunk.token_begin, chunk.token_end,
                                    rank});
}

// The pieces of positions of codes an adapting producer sends, per layer and kind, until each
// code is whole.
class PieceJoiner {
 public:
  PieceJoiner(int64_t begin, int64_t end) : begin_(begin), end_(end) {}
  // Takes `chunk`; returns the whole code once its last piece is here, else nothing.
  absl::StatusOr<std::optional<CodeChunk>> Take(CodeChunk chunk) {
    std::vector<CodeChunk>& held = held_[{chunk.layer, static_cast<int>(chunk.kind)}];
    const int64_t due = held.empty() ? begin_ : held.back().token_end;
    if (chunk.token_begin != due) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a piece of positions [", chunk.token_begin, ", ", chunk.token_end, ") of the ",
          PayloadKindName(chunk.kind), " of layer ", chunk.layer, " where position ", due,
          " was due"));
    }
    const bool last = chunk.token_end == end_;
    held.push_back(std::move(chunk));
    if (!last) return std::optional<CodeChunk>();
    std::vector<const CodeChunk*> parts;
    for (const CodeChunk& part : held) parts.push_back(&part);
    absl::StatusOr<CodeChunk> whole = JoinMixedRankRows(parts);
    held_.erase({held.front().layer, static_cast<int>(held.front().kind)});
    if (!whole.ok()) return whole.status();
    return std::optional<CodeChunk>(*std::move(whole));
  }

 private:
  const int64_t begin_, end_;
  std::map<std::pair<int, int>, std::vector<CodeChunk>> held_;
};

// One unframed chunk, checked against the plan and joined with its other pieces (adaptive
// sessions): the whole chunk to rebuild, or nothing while pieces are missing.
absl::StatusOr<std::optional<CodeChunk>> Unframed(transport::ReceivedChunk& received,
                                                  const v1::TransferHeader& header,
                                                  const std::vector<PlannedChunk>& expected,
                                                  int64_t T, PieceJoiner* pieces,
                                                  ReceiveReport* report) {
  SCD_ASSIGN_OR_RETURN(CodeChunk chunk, UnframeChunk(received.meta, received.payload.view(), T));
  int64_t lowered_rank = 0;
  if (std::string why = ChunkMismatch(chunk, expected, header.adaptive(), &lowered_rank);
      !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  if (lowered_rank > 0) NoteLowered(chunk, lowered_rank, report);
  received.payload.Reset();  // unframing copied the bytes into the chunk's tensors
  if (header.adaptive() && IsCodeKind(chunk.kind)) return pieces->Take(std::move(chunk));
  return std::optional<CodeChunk>(std::move(chunk));
}

// One receive, advanced by events (see the header). Steps run one at a time: each is set off by
// the one before (an armed OnReady, a rebuild's `done`), so its members need no lock but
// `timed_out_`, which the clock's timers write.
class CodeReceiver : public std::enable_shared_from_this<CodeReceiver> {
 public:
  CodeReceiver(std::shared_ptr<transport::ReceiveSession> session, const TransferPlan& plan,
               const std::vector<PlannedChunk>& expected, const std::vector<TokenId>& tokens,
               KvCache* cache, ReceiveOptions options, ReceiveDone done)
      : session_(std::move(session)),
        plan_(plan),
        expected_(expected),
        T_(static_cast<int64_t>(tokens.size())),
        cache_(cache),
        options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
        progress_(options_.progress != nullptr ? options_.progress
                                               : std::make_shared<ReceiveProgress>()),
        report_(progress_->report),
        pieces_(options_.begin, T_),
        done_(std::move(done)) {}

  // Checks the header, arms the deadline and the cancellation, rebuilds what needs no chunk.
  void Start(const CodeDecoder& decoder, const std::vector<TokenId>& tokens);

 private:
  // Waits for the session's next event; the step it sets off runs on the queue.
  void Arm();
  // Takes what the session has: a chunk, the trailer, or its end.
  void Step();
  void Take(transport::ReceivedChunk received);
  // Adds a chunk's rebuild time to its layer's (ReceiveReport.layer_rebuild).
  void NoteLayerRebuild(int layer, absl::Duration spent);
  // The chunk taken at `taken` was rebuilt (its layers `filled`).
  void Rebuilt(absl::StatusOr<std::vector<int>> filled, absl::Time taken);
  // Runs the tail token through the layers rebuilt so far, then `then`.
  void AdvanceTail(RebuildPacing::Done then);
  // Waits for the next chunk, the stall clock started again.
  void Continue(absl::Time taken);
  void Complete();
  // Ends the receive once: what it armed is disarmed, a failure ends the session, `done` hears.
  void End(absl::StatusOr<ReceiveReport> result);
  // A timer fired: the session ends, and the next step ends the receive with `why`.
  void TimeOut(absl::Status why);
  bool cancelled() const {
    return options_.cancellation != nullptr && options_.cancellation->cancelled();
  }

  const std::shared_ptr<transport::ReceiveSession> session_;
  const TransferPlan& plan_;
  const std::vector<PlannedChunk>& expected_;
  const int64_t T_;
  KvCache* const cache_;
  const ReceiveOptions options_;
  Clock* const clock_;
  // The rebuild and the report: the caller's when it continues one (a takeover), else this
  // receive's own.
  const std::shared_ptr<ReceiveProgress> progress_;
  ReceiveReport& report_;
  LayerwiseRebuilder* rebuilder_ = nullptr;  // progress_'s
  PieceJoiner pieces_;
  ReceiveDone done_;
  bool ended_ = false;
  absl::Time started_;
  Clock::Timer deadline_timer_, stall_timer_;
  Cancellation::Registration end_session_;
  absl::Mutex mu_;
  absl::Status timed_out_ ABSL_GUARDED_BY(mu_);
};

void CodeReceiver::Start(const CodeDecoder& decoder, const std::vector<TokenId>& tokens) {
  started_ = clock_->Now();
  // A takeover continues the rebuild from its first layer not rebuilt (held chunks dropped).
  const bool continuing = progress_->rebuilder != nullptr;
  int layer_begin = 0;
  if (continuing) {
    absl::StatusOr<int> from = progress_->rebuilder->Restart();
    if (!from.ok()) return End(from.status());
    layer_begin = *from;
  }
  if (std::string why =
          HeaderMismatch(session_->header(), plan_, expected_, T_, options_.begin, layer_begin);
      !why.empty()) {
    return End(absl::FailedPreconditionError(why));
  }
  if (!continuing) {
    absl::StatusOr<std::unique_ptr<LayerwiseRebuilder>> rebuilder =
        LayerwiseRebuilder::Create(decoder, plan_, tokens, cache_, options_.begin, options_.pacing);
    if (!rebuilder.ok()) return End(rebuilder.status());
    progress_->rebuilder = *std::move(rebuilder);
  }
  rebuilder_ = progress_->rebuilder.get();
  if (options_.deadline != absl::InfiniteFuture()) {
    deadline_timer_ = Clock::Timer(clock_, options_.deadline, [this] {
      TimeOut(absl::DeadlineExceededError(absl::StrCat(
          "no complete transfer within ", absl::FormatDuration(options_.deadline - started_))));
    });
  }
  // A cancellation ends the session at once: the producer hears it, the session is ready.
  if (options_.cancellation != nullptr) {
    end_session_ = options_.cancellation->OnCancel([this](const absl::Status&) {
      session_->Cancel("cancelled by the caller during the transfer");
    });
  }
  if (continuing) return Continue(clock_->Now());  // the tail is through the layers rebuilt
  // The tail runs through a recomputed run from layer 0 (rebuilt without a chunk) first.
  std::shared_ptr<CodeReceiver> self = shared_from_this();
  rebuilder_->Begin([self](absl::StatusOr<std::vector<int>> filled) {
    if (!filled.ok()) return self->End(filled.status());
    self->AdvanceTail([self](absl::Status status) {
      if (!status.ok()) return self->End(status);
      self->Continue(self->clock_->Now());
    });
  });
}

void CodeReceiver::Arm() {
  std::shared_ptr<CodeReceiver> self = shared_from_this();
  session_->OnReady([self] { self->options_.post([self] { self->Step(); }); });
}

void CodeReceiver::Step() {
  if (cancelled()) return End(absl::CancelledError("cancelled by the caller during the transfer"));
  {
    absl::MutexLock lock(&mu_);
    if (!timed_out_.ok()) return End(timed_out_);
  }
  absl::StatusOr<std::optional<transport::ReceivedChunk>> next =
      session_->Next(absl::ZeroDuration());
  if (!next.ok()) {
    if (session_->state() == transport::SessionState::kOpen) return Arm();  // nothing after all
    if (cancelled()) return Step();  // the cancellation ended it: say so
    return End(next.status());       // peer lost, corrupt, cancelled by the producer...
  }
  if (!next->has_value()) return Complete();  // the trailer matched: every chunk is here
  stall_timer_.Reset();  // the stall clock starts again once this chunk is rebuilt
  Take(**std::move(next));
}

void CodeReceiver::Take(transport::ReceivedChunk received) {
  const absl::Time now = clock_->Now();
  if (report_.chunks == 0) report_.first_chunk = now;
  report_.last_chunk = now;
  // What travelled: the data and, for int8 / int4, the scales beside it (the header's count).
  report_.bytes += static_cast<int64_t>(received.payload.size() + received.meta.scales().size());
  ++report_.chunks;
  absl::StatusOr<std::optional<CodeChunk>> chunk =
      Unframed(received, session_->header(), expected_, T_, &pieces_, &report_);
  if (!chunk.ok()) return End(chunk.status());
  if (!chunk->has_value()) return Continue(now);  // more pieces of this code to come
  std::shared_ptr<CodeReceiver> self = shared_from_this();
  const int layer = (*chunk)->layer;
  const absl::Duration before = rebuilder_->rebuild_time();  // Adds are serialized
  rebuilder_->Add(**std::move(chunk),
                  [self, now, layer, before](absl::StatusOr<std::vector<int>> filled) {
                    self->NoteLayerRebuild(layer, self->rebuilder_->rebuild_time() - before);
                    self->Rebuilt(std::move(filled), now);
                  });
}

void CodeReceiver::NoteLayerRebuild(int layer, absl::Duration spent) {
  if (layer < 0) return;
  std::vector<absl::Duration>& per_layer = report_.layer_rebuild;
  if (per_layer.size() <= static_cast<size_t>(layer))
    per_layer.resize(static_cast<size_t>(layer) + 1);
  per_layer[static_cast<size_t>(layer)] += spent;
}

void CodeReceiver::Rebuilt(absl::StatusOr<std::vector<int>> filled, absl::Time taken) {
  if (!filled.ok()) return End(filled.status());
  if (filled->empty()) return Continue(taken);
  std::shared_ptr<CodeReceiver> self = shared_from_this();
  AdvanceTail([self, taken](absl::Status status) {
    if (!status.ok()) return self->End(status);
    if (self->report_.first_layer_ready == absl::InfinitePast()) {
      self->report_.first_layer_ready = self->clock_->Now();
    }
    self->Continue(taken);
  });
}

void CodeReceiver::AdvanceTail(RebuildPacing::Done then) {
  if (options_.tail == nullptr) return then(absl::OkStatus());
  LayerStepper* tail = options_.tail;
  KvCache* cache = cache_;
  options_.pacing.Run(
      1, 1, [tail, cache](int64_t, int64_t) { return tail->Advance(cache).status(); },
      std::move(then));
}

void CodeReceiver::Continue(absl::Time taken) {
  // The work this chunk set off (unframing, the layers it completed); the last chunk's is what
  // no streaming can hide. Waiting for the trailer afterwards is not rebuild time.
  if (report_.chunks > 0) report_.last_rebuild = clock_->Now() - taken;
  if (options_.stall_timeout != absl::InfiniteDuration()) {
    stall_timer_ = Clock::Timer(clock_, clock_->Now() + options_.stall_timeout, [this] {
      TimeOut(absl::DeadlineExceededError(absl::StrCat("the transfer stalled: no chunk within ",
                                                       absl::FormatDuration(options_.stall_timeout),
                                                       " (the transfer timeout)")));
    });
  }
  Arm();
}

void CodeReceiver::Complete() {
  report_.rebuild = rebuilder_->rebuild_time();
  report_.patch = rebuilder_->patch_time();
  if (absl::Status finished = rebuilder_->Finish(); !finished.ok()) return End(finished);
  LayerStepper* tail = options_.tail;
  if (tail != nullptr) {
    report_.tail = tail->compute_time();
    if (!tail->done()) {
      return End(absl::InternalError(absl::StrCat(
          "the cache is rebuilt but the last prompt token ran ", tail->next_layer(), " layers")));
    }
  }
  End(report_);
}

void CodeReceiver::TimeOut(absl::Status why) {
  std::string message(why.message());
  {
    absl::MutexLock lock(&mu_);
    if (!timed_out_.ok()) return;
    timed_out_ = std::move(why);
  }
  session_->Cancel(message);  // the session is ready now: the next step ends the receive
}

void CodeReceiver::End(absl::StatusOr<ReceiveReport> result) {
  if (ended_) return;
  ended_ = true;
  deadline_timer_.Reset();
  stall_timer_.Reset();
  end_session_.Reset();
  // A failure found here ends the session (one the session itself ended with, already ended,
  // is left as it is).
  if (!result.ok()) session_->Cancel(std::string(result.status().message()));
  const ReceiveDone done = std::move(done_);
  done(std::move(result));
}

}  // namespace

int ReceiveProgress::layers_rebuilt() const {
  return rebuilder != nullptr ? rebuilder->layers_rebuilt() : 0;
}

void ReceiveIntoCache(std::shared_ptr<transport::ReceiveSession> session,
                      const CodeDecoder& decoder, const TransferPlan& plan,
                      const std::vector<PlannedChunk>& expected, const std::vector<TokenId>& tokens,
                      KvCache* cache, ReceiveOptions options, ReceiveDone done) {
  auto receiver = std::make_shared<CodeReceiver>(std::move(session), plan, expected, tokens, cache,
                                                 std::move(options), std::move(done));
  receiver->Start(decoder, tokens);
}

}  // namespace scd::consumer
