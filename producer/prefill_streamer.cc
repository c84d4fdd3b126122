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
#include "producer/adaptive_sender.h"

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

// What an adapting target's governor plans with: each layer's bytes at the plan's ranks.
absl::StatusOr<std::vector<LayerBytes>> PlannedLayerBytes(const CodeEncoder& encoder,
                                                          const ModelConfig& config,
                                                          int64_t tokens) {
  SCD_ASSIGN_OR_RETURN(std::vector<PlannedChunk> chunks, encoder.PlannedChunks(config, tokens));
  std::vector<LayerBytes> layers(static_cast<size_t>(config.num_layers));
  for (const PlannedChunk& chunk : chunks) {
    LayerBytes& layer = layers[static_cast<size_t>(chunk.layer)];
    (IsCodeKind(chunk.kind) ? layer.scalable : layer.fixed) += chunk.bytes;
  }
  return layers;
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

  // Adapting targets' senders: each paces its target's layers to the link on a thread of its own.
  report.lowered.assign(targets.size(), {});
  std::vector<std::unique_ptr<AdaptiveSender>> senders(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!targets[i].adapt.enabled()) continue;
    SCD_ASSIGN_OR_RETURN(
        std::vector<LayerBytes> planned,
        PlannedLayerBytes(*targets[i].encoder, producer.config(), T - targets[i].begin));
    senders[i] = std::make_unique<AdaptiveSender>(
        targets[i].session, AdaptiveSender::Options{targets[i].adapt, std::move(planned),
                                                    report.start, held_payload_bytes,
                                                    targets[i].adapt_max_window});
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
      if (status.ok() && senders[i] != nullptr) {
        status = senders[i]->Push(layer, *std::move(chunks));
      }
      for (size_t c = 0; status.ok() && senders[i] == nullptr && c < chunks->size(); ++c) {
        if (report.chunks == 0) report.first_chunk = absl::Now();
        ++report.chunks;
        const absl::Time send_start = absl::Now();
        status = SendCodeChunk(*targets[i].session, (*chunks)[c], held_payload_bytes,
                               &report.bytes);
        report.send += absl::Now() - send_start;
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
    if (senders[i] == nullptr) continue;
    absl::Status sent = senders[i]->Finish();  // every piece handed over
    const AdaptiveSender::Report& paced = senders[i]->report();
    report.bytes += paced.bytes;
    report.chunks += paced.chunks;
    if (paced.chunks > 0 && (report.first_chunk == absl::InfinitePast() ||
                             paced.first_chunk < report.first_chunk)) {
      report.first_chunk = paced.first_chunk;
    }
    report.lowered[i] = paced.lowered;
    if (report.targets[i].ok() && !sent.ok()) {
      targets[i].session->Cancel(std::string(sent.message()));
      report.targets[i] = sent;
    }
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (report.targets[i].ok()) report.targets[i] = targets[i].session->Finish();
  }
  return report;
}

}  // namespace scd::producer
