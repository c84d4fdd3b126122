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
                                                const TransferIdentity& identity, int64_t begin,
                                                int layer_begin) {
  if (begin < 0 || begin >= tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transfer from position ", begin, " of a ", tokens, "-position prefix"));
  }
  if (layer_begin < 0 || layer_begin >= producer.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_begin: ", layer_begin, " of a ", producer.num_layers, "-layer model"));
  }
  SCD_ASSIGN_OR_RETURN(std::vector<PlannedChunk> chunks,
                       encoder.PlannedChunks(producer, tokens - begin));
  v1::TransferHeader header =
      FrameHeader(encoder.plan().mode, tokens, static_cast<int>(producer.num_layers),
                  ChunksFromLayer(chunks, layer_begin), identity);
  header.set_token_begin(static_cast<uint64_t>(begin));
  header.set_layer_begin(static_cast<uint32_t>(layer_begin));
  return header;
}

namespace {

// One prefill pass streaming to its targets: the forward pass's layers, as they come, encoded for
// every live target (or taken from codes kept with the cached prefix) and sent, directly or
// through an adapting target's pacer.
class PrefillPass {
 public:
  PrefillPass(const LlamaModel& producer, absl::Span<const TokenId> tokens,
              const std::vector<StreamTarget>& targets, std::atomic<uint64_t>* held_payload_bytes,
              const PrefixReuse* reuse)
      : producer_(producer),
        tokens_(tokens),
        targets_(targets),
        held_(held_payload_bytes),
        reuse_(reuse),
        cached_(reuse != nullptr ? reuse->cached : nullptr),
        T_(static_cast<int64_t>(tokens.size())),
        M_(cached_ != nullptr ? cached_->tokens : 0) {}

  absl::StatusOr<StreamReport> Run();

 private:
  // Targets of one encoding (codes key) from one position get the same chunks: made once.
  struct Made {
    size_t first;  // the target that encoded them
    std::vector<CodeChunk> chunks;
  };
  using MadeMap = std::map<std::pair<std::string, int64_t>, Made>;

  absl::Status Prepare();
  // What target `i` encodes layer `layer` from: the cached positions it needs joined with the
  // forward pass's ([M, T) in `computed`), over [begin, T).
  absl::StatusOr<LayerCapture> EncodeInput(size_t i, int layer, const LayerCapture& computed,
                                           int64_t begin) const;
  // Target `i`'s chunks of layer `layer`: copied from an equal target's, encoded, taken from the
  // kept codes, or kept and encoded rows joined.
  absl::StatusOr<std::vector<CodeChunk>> ChunksFor(size_t i, int layer,
                                                   const LayerCapture& computed, const Made* same);
  absl::Status Send(size_t i, int layer, absl::StatusOr<std::vector<CodeChunk>> chunks);
  // Sends layer `layer` to every live target; stops the pass once none is left.
  absl::Status SendLayer(int layer, LayerCapture layer_capture);
  // The forward pass, each layer's captures sent as they exist. It ends once the last layer's
  // are out: that layer's attention and MLP (and its cache rows) feed nothing -- no logits, no
  // later layer, a cache discarded with the pass -- so they are not computed, and the trailer
  // follows the last codes at once (1/L of the pass's layers' bulk sooner).
  absl::StatusOr<ForwardOutput> Forward(const CaptureSpec& capture);
  // The adapting targets' senders finished, every live session finished.
  void Finish();

  const LlamaModel& producer_;
  const absl::Span<const TokenId> tokens_;
  const std::vector<StreamTarget>& targets_;
  std::atomic<uint64_t>* const held_;
  const PrefixReuse* const reuse_;
  const CachedPrefix* const cached_;
  const int64_t T_, M_;  // positions in all; loaded from the cache, not computed
  StreamReport report_;
  // Adapting targets' senders: each paces its target's layers to the link (no thread of its own).
  std::vector<std::unique_ptr<AdaptiveSender>> senders_;
  // Per target, where encoding starts: positions [begin, coded) come from codes kept with the
  // cached blocks (none without a codes key or a cache).
  std::vector<int64_t> coded_;
};

absl::Status PrefillPass::Prepare() {
  report_.start = absl::Now();
  report_.first_chunk = absl::InfinitePast();
  report_.targets.assign(targets_.size(), absl::OkStatus());
  if (M_ > T_) return absl::InternalError("the cached prefix is longer than the prompt's");
  report_.cached_tokens = M_;
  report_.computed_tokens = T_ - M_;
  report_.lowered.assign(targets_.size(), {});
  senders_.resize(targets_.size());
  for (const StreamTarget& target : targets_) {
    if (target.layer_begin != 0 && (target.adapt.enabled() || !target.codes_key.empty())) {
      return absl::InternalError("a takeover target adapts or keeps codes");
    }
  }
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!targets_[i].adapt.enabled()) continue;
    SCD_ASSIGN_OR_RETURN(
        std::vector<LayerBytes> planned,
        PlannedLayerBytes(*targets_[i].encoder, producer_.config(), T_ - targets_[i].begin));
    AdaptiveSender::Options adapt;
    adapt.budget = targets_[i].adapt;
    adapt.planned = std::move(planned);
    adapt.start = report_.start;
    adapt.held_payload_bytes = held_;
    adapt.max_window = targets_[i].adapt_max_window;
    senders_[i] = std::make_unique<AdaptiveSender>(targets_[i].session, std::move(adapt));
  }
  coded_.resize(targets_.size());
  for (size_t i = 0; i < targets_.size(); ++i) {
    coded_[i] = cached_ != nullptr
                    ? reuse_->store->CodedEnd(*cached_, targets_[i].codes_key, targets_[i].begin)
                    : targets_[i].begin;
    report_.code_hit_tokens += coded_[i] - targets_[i].begin;
  }
  if (reuse_ != nullptr && reuse_->codes != nullptr) {
    reuse_->codes->assign(targets_.size(), EncodedRun{});
    for (size_t i = 0; i < targets_.size(); ++i) {
      EncodedRun& run = (*reuse_->codes)[i];
      run.key = targets_[i].codes_key;
      run.from = coded_[i];
      run.layers.resize(static_cast<size_t>(producer_.config().num_layers));
      run.encoded.assign(static_cast<size_t>(producer_.config().num_layers), false);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerCapture> PrefillPass::EncodeInput(size_t i, int layer,
                                                      const LayerCapture& computed,
                                                      int64_t begin) const {
  if (begin >= M_) return SliceCapture(computed, begin - M_, T_ - M_);
  SCD_ASSIGN_OR_RETURN(
      LayerCapture from_cache,
      reuse_->store->CachedCapture(*cached_, layer, begin, targets_[i].encoder->plan().capture));
  return JoinCaptures(from_cache, computed);
}

absl::StatusOr<std::vector<CodeChunk>> PrefillPass::ChunksFor(size_t i, int layer,
                                                              const LayerCapture& computed,
                                                              const Made* same) {
  const bool keeps_codes = reuse_ != nullptr && reuse_->codes != nullptr;
  const size_t l = static_cast<size_t>(layer);
  if (same != nullptr) {  // same key and begin: same kept run, same fresh chunks
    if (keeps_codes) {
      const EncodedRun& first = (*reuse_->codes)[same->first];
      (*reuse_->codes)[i].layers[l] = first.layers[l];
      (*reuse_->codes)[i].encoded[l] = first.encoded[l];
    }
    return same->chunks;
  }
  const int64_t begin = targets_[i].begin;
  const int64_t from = coded_[i];  // encoded from here; kept codes before
  std::vector<CodeChunk> fresh;
  if (from < T_) {
    SCD_ASSIGN_OR_RETURN(LayerCapture input, EncodeInput(i, layer, computed, from));
    SCD_ASSIGN_OR_RETURN(fresh, targets_[i].encoder->EncodeLayer(layer, input, T_ - from));
    for (CodeChunk& chunk : fresh) {
      chunk.token_begin += from;
      chunk.token_end += from;
    }
    if (keeps_codes) {
      (*reuse_->codes)[i].layers[l] = fresh;  // tensors shared
      (*reuse_->codes)[i].encoded[l] = true;
    }
  }
  if (from == begin) return fresh;
  SCD_ASSIGN_OR_RETURN(
      std::vector<CodeChunk> kept,
      reuse_->store->CachedChunks(*cached_, targets_[i].codes_key, layer, begin, from));
  if (from == T_) return kept;
  if (kept.size() != fresh.size()) {
    return absl::InternalError(absl::StrCat("layer ", layer, ": ", kept.size(), " kept chunks, ",
                                            fresh.size(), " encoded"));
  }
  for (size_t c = 0; c < kept.size(); ++c) {
    SCD_ASSIGN_OR_RETURN(kept[c], JoinChunkRows({&kept[c], &fresh[c]}));
  }
  return kept;
}

absl::Status PrefillPass::Send(size_t i, int layer, absl::StatusOr<std::vector<CodeChunk>> chunks) {
  if (!chunks.ok()) return chunks.status();
  if (senders_[i] != nullptr) return senders_[i]->Push(layer, *std::move(chunks));
  for (const CodeChunk& chunk : *chunks) {
    if (report_.chunks == 0) report_.first_chunk = absl::Now();
    ++report_.chunks;
    const absl::Time send_start = absl::Now();
    absl::Status status = SendCodeChunk(*targets_[i].session, chunk, held_, &report_.bytes);
    report_.send += absl::Now() - send_start;
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status PrefillPass::SendLayer(int layer, LayerCapture layer_capture) {
  ++report_.layers_run;
  bool any_live = false;
  MadeMap made;
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!report_.targets[i].ok()) continue;
    if (layer < targets_[i].layer_begin) {  // a takeover's consumer has this layer already
      any_live = true;
      continue;
    }
    const absl::Time encode_start = absl::Now();
    const std::pair<std::string, int64_t> made_key{targets_[i].codes_key, targets_[i].begin};
    const Made* same = nullptr;
    if (!targets_[i].codes_key.empty()) {
      if (auto it = made.find(made_key); it != made.end()) same = &it->second;
    }
    absl::StatusOr<std::vector<CodeChunk>> chunks = ChunksFor(i, layer, layer_capture, same);
    report_.encode += absl::Now() - encode_start;
    if (chunks.ok() && same == nullptr && !targets_[i].codes_key.empty()) {
      made.emplace(made_key, Made{i, *chunks});  // tensors shared, not copied
    }
    if (absl::Status status = Send(i, layer, std::move(chunks)); !status.ok()) {
      // The session may still be open (an encode error): end it so the consumer hears why.
      targets_[i].session->Abort(std::string(status.message()));
      report_.targets[i] = status;
      continue;
    }
    any_live = true;
  }
  if (!any_live) {
    return absl::CancelledError(
        absl::StrCat("prefill stopped at layer ", layer, ": every target's session ended"));
  }
  if (reuse_ != nullptr && reuse_->keep != nullptr) {
    (*reuse_->keep)[layer] = std::move(layer_capture);
  }
  if (report_.layer_codes.size() <= static_cast<size_t>(layer)) {
    report_.layer_codes.resize(static_cast<size_t>(layer) + 1);
  }
  report_.layer_codes[static_cast<size_t>(layer)] = absl::Now() - report_.start;
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> PrefillPass::Forward(const CaptureSpec& capture) {
  if (M_ >= T_) {
    // Every position is cached: no forward pass, every layer's codes from the cache.
    for (int l = 0; l < static_cast<int>(producer_.config().num_layers); ++l) {
      SCD_RETURN_IF_ERROR(SendLayer(l, LayerCapture{}));
    }
    return ForwardOutput{};
  }
  KvCache cache = producer_.NewCache(T_);
  if (M_ > 0) SCD_RETURN_IF_ERROR(reuse_->store->LoadInto(*cached_, &cache));
  ForwardOptions options{.logits = LogitsMode::kNone, .capture = &capture};
  const int last = static_cast<int>(producer_.config().num_layers) - 1;
  bool all_sent = false;
  options.on_layer = [this, last, &all_sent](int layer, LayerCapture capture) {
    SCD_RETURN_IF_ERROR(SendLayer(layer, std::move(capture)));
    if (layer < last) return absl::OkStatus();
    all_sent = true;  // stops the pass (LayerCallback: a non-OK status does)
    return absl::CancelledError("the last layer's codes are out");
  };
  absl::StatusOr<ForwardOutput> out =
      producer_.Forward(tokens_.subspan(static_cast<size_t>(M_)), &cache, options);
  if (all_sent) return ForwardOutput{};
  return out;
}

void PrefillPass::Finish() {
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (senders_[i] == nullptr) continue;
    absl::Status sent = senders_[i]->Finish();  // every piece handed over
    const AdaptiveSender::Report& paced = senders_[i]->report();
    report_.bytes += paced.bytes;
    report_.chunks += paced.chunks;
    if (paced.chunks > 0 &&
        (report_.first_chunk == absl::InfinitePast() || paced.first_chunk < report_.first_chunk)) {
      report_.first_chunk = paced.first_chunk;
    }
    report_.lowered[i] = paced.lowered;
    if (report_.targets[i].ok() && !sent.ok()) {
      targets_[i].session->Abort(std::string(sent.message()));
      report_.targets[i] = sent;
    }
  }
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (report_.targets[i].ok()) report_.targets[i] = targets_[i].session->Finish();
  }
}

absl::StatusOr<StreamReport> PrefillPass::Run() {
  SCD_RETURN_IF_ERROR(Prepare());
  const CaptureSpec capture = MergedCapture(
      targets_, reuse_ != nullptr && reuse_->keep != nullptr ? &reuse_->store->capture() : nullptr);
  absl::StatusOr<ForwardOutput> forward = Forward(capture);
  report_.prefill_end = absl::Now();
  report_.forward_complete = forward.ok();
  if (!report_.forward_complete) report_.computed_tokens = 0;  // a pass cut short computed none
  const bool stopped_by_targets =
      !forward.ok() && std::none_of(report_.targets.begin(), report_.targets.end(),
                                    [](const absl::Status& s) { return s.ok(); });
  if (!forward.ok() && !stopped_by_targets) {
    for (const StreamTarget& target : targets_) {
      target.session->Abort(absl::StrCat("producer prefill failed: ", forward.status().message()));
    }
    return forward.status();
  }
  Finish();
  return std::move(report_);
}

}  // namespace

absl::StatusOr<StreamReport> StreamPrefill(const LlamaModel& producer,
                                           absl::Span<const TokenId> tokens,
                                           const std::vector<StreamTarget>& targets,
                                           std::atomic<uint64_t>* held_payload_bytes,
                                           const PrefixReuse* reuse) {
  PrefillPass pass(producer, tokens, targets, held_payload_bytes, reuse);
  return pass.Run();
}

}  // namespace scd::producer
