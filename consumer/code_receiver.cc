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
                           const std::vector<PlannedChunk>& expected, int64_t tokens,
                           int64_t begin) {
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

}  // namespace

namespace {

// The session's next chunk (nullopt: the trailer matched, every chunk is here), within the
// transfer's deadline and `stall_timeout` after `progress`; the session is cancelled on a stall
// or the deadline (an error the session itself ended with is returned as is; a cancellation
// cancels it from its callback).
absl::StatusOr<std::optional<transport::ReceivedChunk>> NextChunk(
    transport::ReceiveSession& session, absl::Time deadline, absl::Time progress,
    absl::Duration timeout, absl::Duration stall_timeout, const Cancellation* cancellation) {
  auto fail = [&](absl::Status status) {
    session.Cancel(std::string(status.message()));
    return status;
  };
  for (;;) {
    const absl::Time until = std::min(deadline, progress + stall_timeout);
    absl::StatusOr<std::optional<transport::ReceivedChunk>> next =
        session.Next(until - absl::Now());
    if (cancellation != nullptr && cancellation->cancelled()) {
      return absl::CancelledError("cancelled by the caller during the transfer");
    }
    if (next.ok()) return next;
    if (!absl::IsDeadlineExceeded(next.status())) return next.status();  // peer lost, corrupt...
    if (absl::Now() < until) continue;
    if (until < deadline) {
      return fail(absl::DeadlineExceededError(absl::StrCat("the transfer stalled: no chunk within ",
                                                           absl::FormatDuration(stall_timeout),
                                                           " (the transfer timeout)")));
    }
    return fail(absl::DeadlineExceededError(
        absl::StrCat("no complete transfer within ", absl::FormatDuration(timeout))));
  }
}

// One received chunk into the cache: unframed, checked against the plan, joined with its other
// pieces (adaptive sessions), handed to the rebuilder; `advance_tail` runs over the layers it
// completed.
absl::Status TakeChunk(transport::ReceivedChunk& received, const v1::TransferHeader& header,
                       const std::vector<PlannedChunk>& expected, int64_t T, PieceJoiner* pieces,
                       LayerwiseRebuilder* rebuilder,
                       const std::function<absl::Status()>& advance_tail, ReceiveReport* report) {
  const absl::Time now = absl::Now();
  if (report->chunks == 0) report->first_chunk = now;
  report->last_chunk = now;
  // What travelled: the data and, for int8 / int4, the scales beside it (the header's count).
  report->bytes += static_cast<int64_t>(received.payload.size() + received.meta.scales().size());
  ++report->chunks;
  SCD_ASSIGN_OR_RETURN(CodeChunk chunk, UnframeChunk(received.meta, received.payload.view(), T));
  int64_t lowered_rank = 0;
  if (std::string why = ChunkMismatch(chunk, expected, header.adaptive(), &lowered_rank);
      !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  if (lowered_rank > 0) NoteLowered(chunk, lowered_rank, report);
  received.payload.Reset();  // unframing copied the bytes into the chunk's tensors
  if (header.adaptive() && IsCodeKind(chunk.kind)) {
    SCD_ASSIGN_OR_RETURN(std::optional<CodeChunk> whole, pieces->Take(std::move(chunk)));
    if (!whole.has_value()) return absl::OkStatus();  // more pieces of this code to come
    chunk = *std::move(whole);
  }
  SCD_ASSIGN_OR_RETURN(std::vector<int> filled, rebuilder->Add(std::move(chunk)));
  if (!filled.empty()) SCD_RETURN_IF_ERROR(advance_tail());
  // The work this chunk set off (unframing, the layers it completed); the last chunk's is what
  // no streaming can hide. Waiting for the trailer afterwards is not rebuild time.
  report->last_rebuild = absl::Now() - now;
  if (!filled.empty() && report->first_layer_ready == absl::InfinitePast()) {
    report->first_layer_ready = absl::Now();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReceiveReport> ReceiveIntoCache(
    transport::ReceiveSession& session, const CodeDecoder& decoder, const TransferPlan& plan,
    const std::vector<PlannedChunk>& expected, const std::vector<TokenId>& tokens, KvCache* cache,
    absl::Duration timeout, Cancellation* cancellation, int64_t begin, LayerStepper* tail,
    const RebuildPacing& pacing, absl::Duration stall_timeout) {
  auto fail = [&](absl::Status status) {
    session.Cancel(std::string(status.message()));
    return status;
  };
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (std::string why = HeaderMismatch(session.header(), plan, expected, T, begin); !why.empty()) {
    return fail(absl::FailedPreconditionError(why));
  }
  absl::StatusOr<std::unique_ptr<LayerwiseRebuilder>> rebuilder =
      LayerwiseRebuilder::Create(decoder, plan, tokens, cache, begin, pacing);
  if (!rebuilder.ok()) return fail(rebuilder.status());
  // Runs the tail token through the layers rebuilt so far (a recomputed run from layer 0 is
  // rebuilt at creation).
  const std::function<absl::Status()> advance_tail = [&]() -> absl::Status {
    if (tail == nullptr) return absl::OkStatus();
    return pacing.Run(1, 1, [&](int64_t, int64_t) { return tail->Advance(cache).status(); });
  };
  if (absl::Status advanced = advance_tail(); !advanced.ok()) return fail(advanced);

  // A cancellation ends the session at once: the producer hears it, Next returns.
  Cancellation::Registration end_session;
  if (cancellation != nullptr) {
    end_session = cancellation->OnCancel([&session](const absl::Status&) {
      session.Cancel("cancelled by the caller during the transfer");
    });
  }
  ReceiveReport report;
  PieceJoiner pieces(begin, T);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time progress = absl::Now();  // the last chunk (or the start)
  for (;;) {
    SCD_ASSIGN_OR_RETURN(
        std::optional<transport::ReceivedChunk> next,
        NextChunk(session, deadline, progress, timeout, stall_timeout, cancellation));
    if (!next.has_value()) break;  // trailer matched: every chunk is here
    if (absl::Status taken = TakeChunk(*next, session.header(), expected, T, &pieces,
                                       rebuilder->get(), advance_tail, &report);
        !taken.ok()) {
      return fail(taken);
    }
    progress = absl::Now();  // the stall clock starts again once this chunk is rebuilt
  }
  report.rebuild = (*rebuilder)->rebuild_time();
  report.patch = (*rebuilder)->patch_time();
  SCD_RETURN_IF_ERROR((*rebuilder)->Finish());
  if (tail != nullptr) {
    report.tail = tail->compute_time();
    if (!tail->done()) {
      return absl::InternalError(absl::StrCat("the cache is rebuilt but the last prompt token ran ",
                                              tail->next_layer(), " layers"));
    }
  }
  return report;
}

}  // namespace scd::consumer
