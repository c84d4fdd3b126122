#include "codec/layerwise_rebuilder.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "model/compute_steps.h"

namespace scd {
namespace {

// The chunk kinds a layer's payload consists of (none for layers left to recomputation).
std::set<PayloadKind> KindsFor(LayerPayload payload) {
  switch (payload) {
    case LayerPayload::kRaw:
    case LayerPayload::kInt4:
      return {PayloadKind::kRawKey, PayloadKind::kRawValue};
    case LayerPayload::kCodes:
      return {PayloadKind::kKeyCode, PayloadKind::kValueCode};
    case LayerPayload::kPatch:
      return {PayloadKind::kHiddenCode};
    case LayerPayload::kNone:
    case LayerPayload::kRecompute:
      break;
  }
  return {};
}

const CodeChunk* Held(const std::map<PayloadKind, CodeChunk>& held, PayloadKind a, PayloadKind b) {
  auto it = held.find(a);
  if (it == held.end()) it = held.find(b);
  return it == held.end() ? nullptr : &it->second;
}

}  // namespace

LayerwiseRebuilder::LayerwiseRebuilder(const CodeDecoder& decoder, std::vector<TokenId> tokens,
                                       KvCache* cache, int64_t begin, RebuildPacing pacing)
    : decoder_(decoder),
      tokens_(std::move(tokens)),
      cache_(cache),
      begin_(begin),
      pacing_(std::move(pacing)) {}

absl::StatusOr<std::unique_ptr<LayerwiseRebuilder>> LayerwiseRebuilder::Create(
    const CodeDecoder& decoder, const TransferPlan& plan, std::vector<TokenId> tokens,
    KvCache* cache, int64_t begin, RebuildPacing pacing) {
  const int layers = static_cast<int>(plan.layers.size());
  if (layers != cache->num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan has ", layers, " layers, the cache ", cache->num_layers()));
  }
  if (tokens.empty()) return absl::InvalidArgumentError("no prefix tokens");
  if (begin < 0 || begin >= static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the transfer begins at position ", begin,
                                                   " of a ", tokens.size(), "-token prefix"));
  }
  for (int l = 0; l < layers; ++l) {
    if (cache->length(l) != begin) {
      return absl::FailedPreconditionError(
          absl::StrCat("LayerwiseRebuilder needs a cache holding the ", begin,
                       " positions before the transfer; layer ", l, " holds ", cache->length(l)));
    }
  }
  std::unique_ptr<LayerwiseRebuilder> rebuilder(
      new LayerwiseRebuilder(decoder, std::move(tokens), cache, begin, std::move(pacing)));
  rebuilder->layers_.resize(layers);
  rebuilder->remaining_ = layers;
  auto recomputed = [&](int l) {
    return plan.layers[l] == LayerPayload::kNone || plan.layers[l] == LayerPayload::kRecompute;
  };
  for (int l = 0; l < layers;) {
    if (!recomputed(l)) {
      rebuilder->layers_[l].expected = KindsFor(plan.layers[l]);
      ++l;
      continue;
    }
    // A maximal run of recomputed layers, as CodeDecoder::Decode forms them.
    int end = l;
    while (end < layers && recomputed(end)) ++end;
    rebuilder->layers_[l].run_end = end;
    for (int m = l + 1; m < end; ++m) rebuilder->layers_[m].expected.clear();
    if (l > 0) rebuilder->layers_[l].expected = {PayloadKind::kHiddenState};  // layer 0: Begin
    l = end;
  }
  return rebuilder;
}

void LayerwiseRebuilder::Begin(Filled done) {
  if (layers_.empty() || layers_[0].run_end <= 0) return done(std::vector<int>());
  Rebuild(0, std::move(done));  // needs nothing from the producer
}

void LayerwiseRebuilder::Add(CodeChunk chunk, Filled done) {
  const int l = chunk.layer;
  if (l < 0 || l >= static_cast<int>(layers_.size())) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("chunk for layer ", l, " but the plan has ", layers_.size(), " layers")));
  }
  const std::string what = absl::StrCat(PayloadKindName(chunk.kind), " of layer ", l);
  if (chunk.token_begin != begin_ || chunk.token_end != static_cast<int64_t>(tokens_.size())) {
    return done(absl::InvalidArgumentError(absl::StrCat(what, " covers tokens [", chunk.token_begin,
                                                        ", ", chunk.token_end, "), the transfer [",
                                                        begin_, ", ", tokens_.size(), ")")));
  }
  LayerState& state = layers_[l];
  if (state.expected.erase(chunk.kind) == 0) {
    const bool again = state.done || state.held.count(chunk.kind) > 0;
    return done(absl::InvalidArgumentError(again ? absl::StrCat("a second copy of the ", what)
                                                 : absl::StrCat("the plan sends no ", what)));
  }
  state.held.emplace(chunk.kind, std::move(chunk));
  if (!state.expected.empty()) return done(std::vector<int>());
  Rebuild(l, std::move(done));
}

void LayerwiseRebuilder::RunPieces(int64_t rows, int layers, RebuildPacing::Piece work,
                                   RebuildPacing::Done done) {
  pacing_.Run(
      rows, layers,
      [this, work = std::move(work)](int64_t begin, int64_t count) -> absl::Status {
        ComputeStep step;  // model work beside other requests' steps (model/compute_steps.h)
        const absl::Time start = absl::Now();
        absl::Status status = work(begin, count);
        rebuild_time_ += absl::Now() - start;
        return status;
      },
      std::move(done));
}

// A recomputed run [layer, end) of the positions: its input (the prefix's embeddings, or the
// producer's residual stream entering `layer`) made by the first piece.
RebuildPacing::Piece LayerwiseRebuilder::RecomputePiece(int layer, int end) {
  const LayerState& state = layers_[layer];
  auto hidden = state.held.find(PayloadKind::kHiddenState);
  const CodeChunk* entering = hidden == state.held.end() ? nullptr : &hidden->second;
  auto input = std::make_shared<at::Tensor>();
  return [this, layer, end, entering, input](int64_t row, int64_t count) -> absl::Status {
    if (!input->defined()) {
      absl::StatusOr<at::Tensor> in = decoder_.SegmentInput(
          layer, entering, absl::MakeConstSpan(tokens_).subspan(static_cast<size_t>(begin_)));
      if (!in.ok()) return in.status();
      *input = *std::move(in);
    }
    return decoder_.RecomputeRows(layer, end, *input, row, count, cache_);
  };
}

// A layer decoded from its held chunks, unpacked by the first piece.
RebuildPacing::Piece LayerwiseRebuilder::DecodePiece(int layer, int64_t rows) {
  const LayerState& state = layers_[layer];
  CodeDecoder::LayerChunks chunks;
  chunks.key = Held(state.held, PayloadKind::kRawKey, PayloadKind::kKeyCode);
  chunks.value = Held(state.held, PayloadKind::kRawValue, PayloadKind::kValueCode);
  chunks.hidden_code = Held(state.held, PayloadKind::kHiddenCode, PayloadKind::kHiddenCode);
  auto unpacked = std::make_shared<std::optional<CodeDecoder::UnpackedLayer>>();
  return [this, layer, rows, chunks, unpacked](int64_t row, int64_t count) -> absl::Status {
    if (!unpacked->has_value()) {
      absl::StatusOr<CodeDecoder::UnpackedLayer> u = decoder_.Unpack(layer, chunks);
      if (!u.ok()) return u.status();
      if (u->rows == 0) {
        return absl::InternalError(absl::StrCat("layer ", layer, " had no payload"));
      }
      if (u->rows != rows) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", layer, "'s payload covers ",
                                                       u->rows, " positions, the transfer ", rows));
      }
      *unpacked = *std::move(u);
    }
    return decoder_.DecodeRows(**unpacked, row, count, cache_);
  };
}

void LayerwiseRebuilder::Rebuild(int layer, Filled done) {
  const absl::Duration before = rebuild_time_;
  const LayerState& state = layers_[layer];
  const int64_t rows = static_cast<int64_t>(tokens_.size()) - begin_;
  const int end = state.run_end > 0 ? state.run_end : layer + 1;
  RebuildPacing::Piece piece =
      state.run_end > 0 ? RecomputePiece(layer, end) : DecodePiece(layer, rows);
  RunPieces(rows, end - layer, std::move(piece),
            [this, layer, end, before, done = std::move(done)](absl::Status status) {
              if (!status.ok()) return done(std::move(status));
              LayerState& rebuilt = layers_[layer];
              const bool patched = rebuilt.held.count(PayloadKind::kHiddenCode) > 0;
              rebuilt.held.clear();  // the codes are in the cache now
              std::vector<int> filled;
              for (int l = layer; l < end; ++l) {
                layers_[l].done = true;
                filled.push_back(l);
                --remaining_;
              }
              if (patched) patch_time_ += rebuild_time_ - before;
              done(std::move(filled));
            });
}

int LayerwiseRebuilder::layers_rebuilt() const {
  int first = 0;
  while (first < static_cast<int>(layers_.size()) && layers_[first].done) ++first;
  return first;
}

absl::StatusOr<int> LayerwiseRebuilder::Restart() {
  const int layers = static_cast<int>(layers_.size());
  const int first = layers_rebuilt();
  for (int l = first; l < layers; ++l) {
    LayerState& state = layers_[l];
    if (state.done) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", l, " is rebuilt but layer ", first, " is not: no restart from one layer"));
    }
    for (auto& [kind, chunk] : state.held) state.expected.insert(kind);
    state.held.clear();
  }
  return first;
}

absl::Status LayerwiseRebuilder::Finish() const {
  if (complete()) return absl::OkStatus();
  std::vector<std::string> missing;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (PayloadKind kind : layers_[l].expected) {
      missing.push_back(absl::StrCat(PayloadKindName(kind), " of layer ", l));
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the transfer ended before its cache was rebuilt: ", remaining_,
                   " layers missing (", absl::StrJoin(missing, ", "), ")"));
}

}  // namespace scd
