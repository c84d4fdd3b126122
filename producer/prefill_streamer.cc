#include "producer/prefill_streamer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "codec/chunk_rows.h"

namespace scd::producer {
namespace {

// What every target's plan (and the prefix store, when given) needs captured, merged.
CaptureSpec MergedCapture(const std::vector<StreamTarget>& targets, const CaptureSpec* extra) {
  CaptureSpec merged;
  std::vector<const CaptureSpec*> specs;
  for (const StreamTarget& target : targets) specs.push_back(&target.encoder->plan().capture);
  if (extra != nullptr) specs.push_back(extra);
  for (const CaptureSpec* spec_ptr : specs) {
    const CaptureSpec& spec = *spec_ptr;
    merged.key_prerope |= spec.key_prerope;
    merged.value |= spec.value;
    merged.attn_input |= spec.attn_input;
    merged.residual |= spec.residual;
    for (int layer : spec.layers) {
      if (std::find(merged.layers.begin(), merged.layers.end(), layer) == merged.layers.end()) {
        merged.layers.push_back(layer);
      }
    }
  }
  std::sort(merged.layers.begin(), merged.layers.end());
  return merged;
}

// Keeps a chunk's bytes alive while the transport holds them, counted in `held`.
class HeldChunk {
 public:
  HeldChunk(std::shared_ptr<const void> owner, uint64_t size, std::atomic<uint64_t>* held)
      : owner_(std::move(owner)), size_(size), held_(held) {
    held_->fetch_add(size_);
  }
  ~HeldChunk() { held_->fetch_sub(size_); }
  HeldChunk(const HeldChunk&) = delete;
  HeldChunk& operator=(const HeldChunk&) = delete;

 private:
  std::shared_ptr<const void> owner_;
  const uint64_t size_;
  std::atomic<uint64_t>* const held_;
};

bool IsCode(PayloadKind kind) {
  return kind == PayloadKind::kKeyCode || kind == PayloadKind::kValueCode ||
         kind == PayloadKind::kHiddenCode;
}

// What an adapting target's governor plans with: each layer's bytes at the plan's ranks.
absl::StatusOr<std::vector<LayerBytes>> PlannedLayerBytes(const CodeEncoder& encoder,
                                                          const ModelConfig& config,
                                                          int64_t tokens) {
  SCD_ASSIGN_OR_RETURN(std::vector<PlannedChunk> chunks, encoder.PlannedChunks(config, tokens));
  std::vector<LayerBytes> layers(static_cast<size_t>(config.num_layers));
  for (const PlannedChunk& chunk : chunks) {
    LayerBytes& layer = layers[static_cast<size_t>(chunk.layer)];
    (IsCode(chunk.kind) ? layer.scalable : layer.fixed) += chunk.bytes;
  }
  return layers;
}

// An adapting target's pacing state: the governor, the window (one layer's planned bytes), and
// what was in flight right after the last hand-over.
struct Adapter {
  RankGovernor governor;
  size_t window = 0;
  absl::Time start;  // the pass's
  int layers = 0;    // the pass's
  absl::Time handed = absl::InfinitePast();
  size_t inflight_after = 0;
};

// An adapting target's layer: waits until the link is ready for it (at most one layer's planned
// bytes in flight, or the budget's deadline), learns the link's goodput from what drained since
// the last hand-over (when bytes were queued throughout, the link's rate), and cuts the layer's
// codes to the share of their ranks the budget leaves. True when it lowered them. `waited`
// accumulates the time the link held the pass.
absl::StatusOr<bool> AdaptLayer(Adapter& a, transport::SendSession& session, int layer,
                                std::vector<CodeChunk>* chunks, absl::Duration* waited) {
  size_t inflight = session.inflight_bytes();
  if (inflight > a.window) {
    const absl::Time wait_start = absl::Now();
    inflight = session.AwaitInflightAtMost(a.window, a.governor.deadline());
    *waited += absl::Now() - wait_start;
  }
  const absl::Time now = absl::Now();
  if (a.handed != absl::InfinitePast() && inflight > 0 && a.inflight_after > inflight) {
    a.governor.ObserveDrain(static_cast<int64_t>(a.inflight_after - inflight), now - a.handed);
  }
  // When the pass will have made its last layer, at its pace so far (layer `layer` is made).
  const absl::Time compute_done = now + (now - a.start) / (layer + 1) * (a.layers - layer - 1);
  const double scale =
      a.governor.ScaleFor(layer, now, static_cast<int64_t>(inflight), compute_done);
  bool lowered = false;
  for (CodeChunk& chunk : *chunks) {
    if (!IsCode(chunk.kind) || chunk.shape.empty()) continue;
    const int64_t rank = RankGovernor::ScaledRank(chunk.shape.back(), scale);
    if (rank == chunk.shape.back()) continue;
    SCD_ASSIGN_OR_RETURN(chunk, LowerChunkRank(chunk, rank));
    lowered = true;
  }
  return lowered;
}

}  // namespace

absl::StatusOr<v1::TransferHeader> StreamHeader(const CodeEncoder& encoder,
                                                const ModelConfig& producer, int64_t tokens,
                                                const TransferIdentity& identity,
                                                int64_t begin) {
  if (begin < 0 || begin >= tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transfer from position ", begin, " of a ", tokens, "-position prefix"));
  }
  SCD_ASSIGN_OR_RETURN(std::vector<PlannedChunk> chunks,
                       encoder.PlannedChunks(producer, tokens - begin));
  v1::TransferHeader header = FrameHeader(encoder.plan().mode, tokens,
                                          static_cast<int>(producer.num_layers), chunks, identity);
  header.set_token_begin(static_cast<uint64_t>(begin));
  return header;
}

absl::StatusOr<StreamReport> StreamPrefill(const LlamaModel& producer,
                                           absl::Span<const TokenId> tokens,
                                           const std::vector<StreamTarget>& targets,
                                           std::atomic<uint64_t>* held_payload_bytes,
                                           const PrefixReuse* reuse) {
  StreamReport report;
  report.start = absl::Now();
  report.first_chunk = absl::InfinitePast();
  report.targets.assign(targets.size(), absl::OkStatus());
  const int64_t T = static_cast<int64_t>(tokens.size());
  const CachedPrefix* cached = reuse != nullptr ? reuse->cached : nullptr;
  const int64_t M = cached != nullptr ? cached->tokens : 0;  // positions loaded, not computed
  if (M > T) return absl::InternalError("the cached prefix is longer than the prompt's");
  report.cached_tokens = M;
  report.computed_tokens = T - M;
  const CaptureSpec capture = MergedCapture(
      targets, reuse != nullptr && reuse->keep != nullptr ? &reuse->store->capture() : nullptr);

  // Adapting targets' governors and their windows (one layer's planned bytes, at least 64 KiB).
  report.lowered.assign(targets.size(), {});
  std::vector<std::optional<Adapter>> adapters(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].adapt.enabled()) continue;
    SCD_ASSIGN_OR_RETURN(
        std::vector<LayerBytes> planned,
        PlannedLayerBytes(*targets[i].encoder, producer.config(), T - targets[i].begin));
    int64_t largest = 0;
    for (const LayerBytes& layer : planned) largest = std::max(largest, layer.scalable + layer.fixed);
    adapters[i].emplace(Adapter{RankGovernor(targets[i].adapt, std::move(planned), report.start),
                                std::max<size_t>(size_t{64} << 10, static_cast<size_t>(largest)),
                                report.start, static_cast<int>(producer.config().num_layers)});
  }

  // Per target, where encoding starts: positions [begin, coded) come from codes kept with the
  // cached blocks (none without a codes key or a cache).
  std::vector<int64_t> coded(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    coded[i] = cached != nullptr ? reuse->store->CodedEnd(*cached, targets[i].codes_key,
                                                           targets[i].begin)
                                 : targets[i].begin;
    report.code_hit_tokens += coded[i] - targets[i].begin;
  }
  if (reuse != nullptr && reuse->codes != nullptr) {
    reuse->codes->assign(targets.size(), EncodedRun{});
    for (size_t i = 0; i < targets.size(); ++i) {
      EncodedRun& run = (*reuse->codes)[i];
      run.key = targets[i].codes_key;
      run.from = coded[i];
      run.layers.resize(static_cast<size_t>(producer.config().num_layers));
      run.encoded.assign(static_cast<size_t>(producer.config().num_layers), false);
    }
  }

  // What target `i` encodes layer `layer` from: the cached positions it needs joined with the
  // forward pass's ([M, T) in `computed`), over [begin, T).
  auto encode_input = [&](size_t i, int layer, const LayerCapture& computed,
                          int64_t begin) -> absl::StatusOr<LayerCapture> {
    if (begin >= M) return SliceCapture(computed, begin - M, T - M);
    SCD_ASSIGN_OR_RETURN(LayerCapture from_cache,
                         reuse->store->CachedCapture(*cached, layer, begin,
                                                     targets[i].encoder->plan().capture));
    return JoinCaptures(from_cache, computed);
  };

  // Sends layer `layer` to every live target; stops the pass once none is left.
  auto send_layer = [&](int layer, LayerCapture layer_capture) -> absl::Status {
    ++report.layers_run;
    bool any_live = false;
    // Targets of one encoding (codes key) from one position get the same chunks: made once.
    struct Made {
      size_t first;  // the target that encoded them
      std::vector<CodeChunk> chunks;
    };
    std::map<std::pair<std::string, int64_t>, Made> made;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!report.targets[i].ok()) continue;
      const absl::Time encode_start = absl::Now();
      const int64_t begin = targets[i].begin;
      const int64_t from = coded[i];  // encoded from here; kept codes before
      const std::pair<std::string, int64_t> made_key{targets[i].codes_key, begin};
      auto same = targets[i].codes_key.empty() ? made.end() : made.find(made_key);
      absl::StatusOr<std::vector<CodeChunk>> chunks = [&]() -> absl::StatusOr<std::vector<CodeChunk>> {
        if (same != made.end()) {  // same key and begin: same kept run, same fresh chunks
          if (reuse != nullptr && reuse->codes != nullptr) {
            const EncodedRun& first = (*reuse->codes)[same->second.first];
            (*reuse->codes)[i].layers[static_cast<size_t>(layer)] =
                first.layers[static_cast<size_t>(layer)];
            (*reuse->codes)[i].encoded[static_cast<size_t>(layer)] =
                first.encoded[static_cast<size_t>(layer)];
          }
          return same->second.chunks;
        }
        std::vector<CodeChunk> fresh;
        if (from < T) {
          SCD_ASSIGN_OR_RETURN(LayerCapture input, encode_input(i, layer, layer_capture, from));
          SCD_ASSIGN_OR_RETURN(fresh, targets[i].encoder->EncodeLayer(layer, input, T - from));
          for (CodeChunk& chunk : fresh) {
            chunk.token_begin += from;
            chunk.token_end += from;
          }
          if (reuse != nullptr && reuse->codes != nullptr) {
            (*reuse->codes)[i].layers[static_cast<size_t>(layer)] = fresh;  // tensors shared
            (*reuse->codes)[i].encoded[static_cast<size_t>(layer)] = true;
          }
        }
        if (from == begin) return fresh;
        SCD_ASSIGN_OR_RETURN(std::vector<CodeChunk> kept,
                             reuse->store->CachedChunks(*cached, targets[i].codes_key, layer,
                                                        begin, from));
        if (from == T) return kept;
        if (kept.size() != fresh.size()) {
          return absl::InternalError(absl::StrCat("layer ", layer, ": ", kept.size(),
                                                  " kept chunks, ", fresh.size(), " encoded"));
        }
        for (size_t c = 0; c < kept.size(); ++c) {
          SCD_ASSIGN_OR_RETURN(kept[c], JoinChunkRows({&kept[c], &fresh[c]}));
        }
        return kept;
      }();
      report.encode += absl::Now() - encode_start;
      if (chunks.ok() && same == made.end() && !targets[i].codes_key.empty()) {
        made.emplace(made_key, Made{i, *chunks});  // tensors shared, not copied
      }
      absl::Status status = chunks.status();
      if (status.ok() && adapters[i].has_value()) {
        absl::StatusOr<bool> lowered =
            AdaptLayer(*adapters[i], *targets[i].session, layer, &*chunks, &report.send);
        if (!lowered.ok()) status = lowered.status();
        if (lowered.ok() && *lowered) report.lowered[i].push_back(layer);
      }
      for (size_t c = 0; status.ok() && c < chunks->size(); ++c) {
        FramedChunk framed = FrameChunk((*chunks)[c]);
        if (report.chunks == 0) report.first_chunk = absl::Now();
        report.bytes += static_cast<int64_t>(framed.size);
        ++report.chunks;
        if (held_payload_bytes != nullptr) {
          framed.owner =
              std::make_shared<HeldChunk>(std::move(framed.owner), framed.size, held_payload_bytes);
        }
        const absl::Time send_start = absl::Now();
        status = targets[i].session->SendChunk(
            std::move(framed.meta),
            transport::Payload(framed.data, framed.size, std::move(framed.owner)));
        report.send += absl::Now() - send_start;
      }
      if (status.ok() && adapters[i].has_value()) {
        adapters[i]->handed = absl::Now();
        adapters[i]->inflight_after = targets[i].session->inflight_bytes();
      }
      if (!status.ok()) {
        // The session may still be open (an encode error): end it so the consumer hears why.
        targets[i].session->Cancel(std::string(status.message()));
        report.targets[i] = status;
        continue;
      }
      any_live = true;
    }
    if (!any_live) {
      return absl::CancelledError(
          absl::StrCat("prefill stopped at layer ", layer, ": every target's session ended"));
    }
    if (reuse != nullptr && reuse->keep != nullptr) (*reuse->keep)[layer] = std::move(layer_capture);
    return absl::OkStatus();
  };

  absl::StatusOr<ForwardOutput> forward = ForwardOutput{};
  if (M < T) {
    KvCache cache = producer.NewCache(T);
    if (M > 0) {
      if (absl::Status loaded = reuse->store->LoadInto(*cached, &cache); !loaded.ok()) {
        forward = loaded;
      }
    }
    if (forward.ok()) {
      ForwardOptions options{.logits = LogitsMode::kNone, .capture = &capture};
      options.on_layer = send_layer;
      forward = producer.Forward(tokens.subspan(static_cast<size_t>(M)), &cache, options);
    }
  } else {
    // Every position is cached: no forward pass, every layer's codes from the cache.
    for (int l = 0; l < static_cast<int>(producer.config().num_layers) && forward.ok(); ++l) {
      if (absl::Status sent = send_layer(l, LayerCapture{}); !sent.ok()) forward = sent;
    }
  }
  report.prefill_end = absl::Now();
  report.forward_complete = forward.ok();
  if (!report.forward_complete) report.computed_tokens = 0;  // a pass cut short computed no prefix
  const bool stopped_by_targets =
      !forward.ok() && std::none_of(report.targets.begin(), report.targets.end(),
                                    [](const absl::Status& s) { return s.ok(); });
  if (!forward.ok() && !stopped_by_targets) {
    for (const StreamTarget& target : targets) {
      target.session->Cancel(absl::StrCat("producer prefill failed: ", forward.status().message()));
    }
    return forward.status();
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (report.targets[i].ok()) report.targets[i] = targets[i].session->Finish();
  }
  return report;
}

}  // namespace scd::producer
