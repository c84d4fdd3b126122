#include "calib/calibrator.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "calib/report_json.h"
#include "calib/text_corpus.h"
#include "codec/transfer.h"

namespace scd {
namespace {

absl::Status CheckPair(const ModelConfig& pc, const ModelConfig& cc,
                       const CalibrationOptions& options) {
  if (pc.num_layers != cc.num_layers || pc.num_kv_heads != cc.num_kv_heads ||
      pc.head_dim != cc.head_dim || pc.hidden_size != cc.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "producer and consumer must share the architecture: layers ", pc.num_layers, "/",
        cc.num_layers, ", kv heads ", pc.num_kv_heads, "/", cc.num_kv_heads, ", head_dim ",
        pc.head_dim, "/", cc.head_dim, ", hidden ", pc.hidden_size, "/", cc.hidden_size));
  }
  const int64_t max_len = std::min(pc.max_position_embeddings, cc.max_position_embeddings);
  const int heldout_len = options.heldout_prefix + options.heldout_continuation + 1;
  if (options.tokens > max_len || heldout_len > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefixes of ", options.tokens, " and windows of ", heldout_len,
                     " tokens exceed the models' ", max_len, " positions"));
  }
  return absl::OkStatus();
}

// Sequences holding every non-special token id once, shuffled, each `options.tokens` long
// (BOS first; a short tail borrows from the start).
std::vector<std::vector<TokenId>> VocabularySweep(int64_t vocab, const Tokenizer& tokenizer,
                                                  const CalibrationOptions& options) {
  std::vector<TokenId> ids;
  for (TokenId id = 0; id < vocab; ++id) {
    if (!tokenizer.IsSpecial(id) && id != tokenizer.bos_token_id().value_or(-1)) ids.push_back(id);
  }
  std::mt19937_64 rng(options.seed + 7);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<TokenId>> out;
  const size_t body = static_cast<size_t>(options.tokens) - 1;
  for (size_t i = 0; i < ids.size(); i += body) {
    std::vector<TokenId> seq;
    if (tokenizer.bos_token_id()) seq.push_back(*tokenizer.bos_token_id());
    for (size_t j = i; j < std::min(ids.size(), i + body); ++j) seq.push_back(ids[j]);
    for (size_t j = 0; seq.size() < static_cast<size_t>(options.tokens); ++j) seq.push_back(ids[j]);
    out.push_back(std::move(seq));
  }
  return out;
}

// Models what travels: codes and raw tensors go over the wire in f16.
at::Tensor F16(const at::Tensor& t) { return t.to(at::kHalf).to(at::kFloat); }

// Every variant of one held-out window's per-layer prefix cache that the policy searches
// combine, built once: the translators do not change during the search.
struct HeldoutCaches {
  std::vector<at::Tensor> oracle_k, oracle_v;  // the consumer's own cache, post-RoPE
  std::vector<at::Tensor> raw_k, raw_v;        // the producer's pre-RoPE K, V as sent (f16)
  std::vector<at::Tensor> reuse_k, reuse_v;    // reuse-decoded from f16 codes, pre-RoPE
};

absl::StatusOr<HeldoutCaches> BuildHeldoutCaches(const LlamaModel& producer,
                                                 const LlamaModel& consumer,
                                                 const Artifact& artifact,
                                                 const std::vector<TokenId>& prefix) {
  const CaptureSpec capture = CaptureSpec::All(consumer.config());
  const auto n = static_cast<int64_t>(prefix.size());
  KvCache a_cache = producer.NewCache(n), b_cache = consumer.NewCache(n);
  SCD_ASSIGN_OR_RETURN(
      ForwardOutput a,
      producer.Forward(prefix, &a_cache, {.logits = LogitsMode::kNone, .capture = &capture}));
  SCD_RETURN_IF_ERROR(consumer.Forward(prefix, &b_cache, {.logits = LogitsMode::kNone}).status());
  HeldoutCaches h;
  for (int l = 0; l < static_cast<int>(artifact.layers.size()); ++l) {
    const LayerCapture& c = a.captures.at(l);
    const ArtifactLayer& t = artifact.layers[l];
    h.oracle_k.push_back(b_cache.keys(l).clone());
    h.oracle_v.push_back(b_cache.values(l).clone());
    h.raw_k.push_back(F16(c.key_prerope));
    h.raw_v.push_back(F16(c.value));
    h.reuse_k.push_back(F16(t.key.Decode(F16(t.key.Encode(c.key_prerope, t.key.rank())))));
    h.reuse_v.push_back(F16(t.value.Decode(F16(t.value.Encode(c.value, t.value.rank())))));
  }
  return h;
}

// F(S) = -KL on the held-out split with the layers in S restored to the oracle and every other
// layer reuse-decoded (patch policy) or raw (recompute baseline).
class RestoredSetScorer {
 public:
  RestoredSetScorer(const LlamaModel& consumer, const FidelityEvaluator& evaluator,
                    const std::vector<HeldoutCaches>& caches, bool raw_base, Progress* progress)
      : consumer_(consumer),
        evaluator_(evaluator),
        caches_(caches),
        raw_base_(raw_base),
        progress_(progress) {}

  absl::StatusOr<double> operator()(const std::vector<int>& restored) const {
    auto build = [&](int w, KvCache* cache, int64_t* bytes) {
      *bytes = 0;
      return Fill(caches_[w], restored, cache);
    };
    SCD_ASSIGN_OR_RETURN(FidelityMetrics m, evaluator_.Evaluate(build, /*greedy=*/false));
    progress_->Advance();
    progress_->SetDetail(absl::StrFormat("KL %.4f", m.kl));
    return -m.kl;
  }

 private:
  absl::Status Fill(const HeldoutCaches& h, const std::vector<int>& restored,
                    KvCache* cache) const {
    for (int l = 0; l < static_cast<int>(h.oracle_k.size()); ++l) {
      if (std::find(restored.begin(), restored.end(), l) != restored.end()) {
        SCD_RETURN_IF_ERROR(
            consumer_.LoadPrefix(l, h.oracle_k[l], h.oracle_v[l], KeyFormat::kPostRope, cache));
        continue;
      }
      const auto& k = raw_base_ ? h.raw_k : h.reuse_k;
      const auto& v = raw_base_ ? h.raw_v : h.reuse_v;
      SCD_RETURN_IF_ERROR(consumer_.LoadPrefix(l, k[l], v[l], KeyFormat::kPreRope, cache));
    }
    return absl::OkStatus();
  }

  const LlamaModel& consumer_;
  const FidelityEvaluator& evaluator_;
  const std::vector<HeldoutCaches>& caches_;
  bool raw_base_;
  Progress* progress_;
};

// The fit's settings and resulting ranks, echoed into the report.
void FillSettings(const CalibrationOptions& options, const PairedTraces& traces,
                  const Artifact& artifact, CalibrationReport* report) {
  report->rows = traces.rows_seen();
  report->fit_method = FitMethodName(options.fit_method);
  report->hidden_basis = FitMethodName(options.hidden_basis);
  report->energy = options.energy;
  report->ridge = options.ridge;
  report->per_head = options.per_head;
  report->aligner_shape = options.aligner.shape;
  report->aligner_loss =
      options.aligner.loss == AlignerTrainOptions::Loss::kKeyValue ? "kv" : "hidden";
  report->seed = options.seed;
  report->ranks.clear();
  for (const ArtifactLayer& l : artifact.layers) {
    report->ranks.push_back({l.key.rank(), l.value.rank(), l.patch ? l.patch->rank() : 0});
  }
}

}  // namespace

absl::StatusOr<CalibrationData> LoadCalibrationData(const ModelConfig& producer,
                                                    const ModelConfig& consumer,
                                                    const Tokenizer& tokenizer,
                                                    const CalibrationOptions& options,
                                                    CalibrationDataReport* report) {
  // Calibration prefixes from the first 90 % of the documents, the held-out split from the rest.
  const int heldout_len = options.heldout_prefix + options.heldout_continuation + 1;
  SCD_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::Load(options.data_path, tokenizer));
  CalibrationData data;
  SCD_ASSIGN_OR_RETURN(data.prefixes, corpus.Sequences(options.prefixes, options.tokens, 0.0, 0.9));
  SCD_ASSIGN_OR_RETURN(data.heldout,
                       corpus.Sequences(options.heldout_windows, heldout_len, 0.9, 1.0));
  report->vocab_sweep_sequences = 0;
  if (options.vocab_sweep) {
    for (auto& seq :
         VocabularySweep(std::min(producer.vocab_size, consumer.vocab_size), tokenizer, options)) {
      data.prefixes.push_back(std::move(seq));
      ++report->vocab_sweep_sequences;
    }
  }
  report->path = options.data_path;
  report->prefixes = options.prefixes;
  report->tokens = options.tokens;
  report->heldout_windows = options.heldout_windows;
  report->heldout_prefix = options.heldout_prefix;
  report->heldout_continuation = options.heldout_continuation;
  return data;
}

absl::StatusOr<FidelityEvaluator> LoadHeldoutSplit(const LlamaModel& consumer,
                                                   const Tokenizer& tokenizer,
                                                   const CalibrationOptions& options) {
  const int heldout_len = options.heldout_prefix + options.heldout_continuation + 1;
  SCD_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::Load(options.data_path, tokenizer));
  SCD_ASSIGN_OR_RETURN(auto windows,
                       corpus.Sequences(options.heldout_windows, heldout_len, 0.9, 1.0));
  const FidelityOptions fo{options.heldout_prefix, options.heldout_continuation, 0};
  return FidelityEvaluator::Create(consumer, std::move(windows), fo);
}

std::string HeldoutSplitName(const CalibrationOptions& options) {
  return absl::StrCat("held-out: last 10% of ",
                      std::filesystem::path(options.data_path).filename().string(), ", ",
                      options.heldout_windows, " windows of ", options.heldout_prefix, "+",
                      options.heldout_continuation, " tokens");
}

absl::Status CollectPairedTraces(const LlamaModel& producer, const LlamaModel& consumer,
                                 const std::vector<std::vector<TokenId>>& prefixes, bool progress,
                                 PairedTraces* traces) {
  const CaptureSpec capture = CaptureSpec::All(consumer.config());
  Progress bar("paired prefills", static_cast<int64_t>(prefixes.size()), progress);
  for (const auto& prefix : prefixes) {
    const auto n = static_cast<int64_t>(prefix.size());
    KvCache a_cache = producer.NewCache(n), b_cache = consumer.NewCache(n);
    const ForwardOptions forward{.logits = LogitsMode::kNone, .capture = &capture};
    SCD_ASSIGN_OR_RETURN(ForwardOutput a, producer.Forward(prefix, &a_cache, forward));
    SCD_ASSIGN_OR_RETURN(ForwardOutput b, consumer.Forward(prefix, &b_cache, forward));
    SCD_RETURN_IF_ERROR(traces->Add(a.captures, b.captures));
    bar.Advance();
  }
  return absl::OkStatus();
}

absl::Status FitTranslators(const PairedTraces& traces, const CalibrationOptions& options,
                            Artifact* artifact, std::vector<ReuseTranslator>* bases) {
  auto grams = [&](const std::vector<GramStats>& per_head) {
    return options.per_head ? per_head : std::vector<GramStats>{PairedTraces::Merged(per_head)};
  };
  bases->assign(traces.layers(), ReuseTranslator());
  for (int l = 0; l < traces.layers(); ++l) {
    TranslatorFitOptions kv{options.fit_method, options.rank_k, options.energy, options.ridge};
    ArtifactLayer layer;
    SCD_ASSIGN_OR_RETURN(layer.key, ReuseTranslator::Fit(grams(traces.key_grams(l)), kv));
    kv.rank = options.rank_v;
    SCD_ASSIGN_OR_RETURN(layer.value, ReuseTranslator::Fit(grams(traces.value_grams(l)), kv));
    TranslatorFitOptions h{options.hidden_basis, options.rank_h, options.energy, options.ridge};
    SCD_ASSIGN_OR_RETURN((*bases)[l], ReuseTranslator::Fit({traces.hidden_grams(l)}, h));
    artifact->layers.push_back(std::move(layer));
  }
  return absl::OkStatus();
}

absl::Status SelectLayerPolicies(const LlamaModel& producer, const LlamaModel& consumer,
                                 const Artifact& artifact, const FidelityEvaluator& heldout,
                                 const CalibrationOptions& options, CalibrationReport* report) {
  const int layers = static_cast<int>(artifact.layers.size());
  std::vector<HeldoutCaches> caches;
  for (int w = 0; w < static_cast<int>(heldout.windows().size()); ++w) {
    SCD_ASSIGN_OR_RETURN(HeldoutCaches c,
                         BuildHeldoutCaches(producer, consumer, artifact, heldout.Prefix(w)));
    caches.push_back(std::move(c));
  }
  const LayerPolicyOptions& po = options.policy;
  const int pool = po.pool > 0 ? std::min(po.pool, layers) : layers;
  const int k_cap = std::min(layers, po.fixed_k > 0 ? po.fixed_k : po.k_max);
  {
    Progress progress("patch-layer policy", 1 + layers + k_cap * pool, options.progress);
    RestoredSetScorer score(consumer, heldout, caches, /*raw_base=*/false, &progress);
    SCD_ASSIGN_OR_RETURN(report->patch_policy, SelectLayers(layers, score, po));
  }
  LayerPolicyOptions ro = po;
  ro.fixed_k =
      options.recompute_layers > 0 ? options.recompute_layers : std::max(1, report->patch_policy.k);
  Progress progress("recompute-baseline policy", 1 + layers + ro.fixed_k * pool, options.progress);
  RestoredSetScorer score(consumer, heldout, caches, /*raw_base=*/true, &progress);
  SCD_ASSIGN_OR_RETURN(report->recompute_policy, SelectLayers(layers, score, ro));
  return absl::OkStatus();
}

absl::Status TrainPatchAligners(const LlamaModel& consumer, const PairedTraces& traces,
                                const std::vector<ReuseTranslator>& bases,
                                const std::vector<int>& patch_layers,
                                const CalibrationOptions& options, Artifact* artifact,
                                std::map<int, AlignerTrainReport>* reports) {
  const ModelConfig& cc = consumer.config();
  for (int l : patch_layers) {
    const LayerWeights& w = consumer.weights().layers[l];
    at::Tensor kv_weight = at::cat({w.Wk(cc), w.Wv(cc)}, 0).to(at::kCPU, at::kFloat);
    AlignerTrainOptions ao = options.aligner;
    ao.seed = options.seed + static_cast<uint64_t>(l);
    AlignerTrainReport report;
    Progress progress(absl::StrCat("aligner layer ", l), ao.max_epochs, options.progress);
    auto on_epoch = [&](int, double loss) {
      progress.Advance();
      progress.SetDetail(absl::StrFormat("held-out loss %.4g", loss));
    };
    SCD_ASSIGN_OR_RETURN(PatchAligner aligner,
                         TrainAligner(bases[l], traces.hidden_a(l), traces.hidden_b(l), kv_weight,
                                      ao, &report, on_epoch));
    progress.Done();
    spdlog::info("aligner layer {}: held-out loss {:.4g} (linear {:.4g}), {} epochs, {:.1f} s", l,
                 report.heldout, report.linear_heldout, report.epochs, report.seconds);
    artifact->layers[l].route = LayerRoute::kPatch;
    artifact->layers[l].patch = std::move(aligner);
    (*reports)[l] = report;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModeFidelity>> MeasureFidelity(const LlamaModel& producer,
                                                          const LlamaModel& consumer,
                                                          const Artifact& artifact,
                                                          const FidelityEvaluator& heldout) {
  std::vector<ModeFidelity> out;
  const double raw_f16 = static_cast<double>(consumer.config().KvBytesPerToken(2));
  for (TransferMode mode : {TransferMode::kRaw, TransferMode::kReuse, TransferMode::kScd}) {
    SCD_ASSIGN_OR_RETURN(TransferPath path,
                         TransferPath::Create(mode, producer, consumer, &artifact, {}));
    auto build = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
      SCD_ASSIGN_OR_RETURN(TransferStats stats, path.Run(heldout.Prefix(w), cache));
      *bytes = stats.payload_bytes;
      return absl::OkStatus();
    };
    ModeFidelity f;
    f.mode = mode;
    SCD_ASSIGN_OR_RETURN(f.metrics, heldout.Evaluate(build, /*greedy=*/false));
    f.payload_ratio = f.metrics.bytes_per_token / raw_f16;
    out.push_back(f);
  }
  return out;
}

absl::StatusOr<CalibrationResult> Calibrate(const LlamaModel& producer, const LlamaModel& consumer,
                                            const Tokenizer& tokenizer,
                                            const CalibrationOptions& options) {
  const ModelConfig& pc = producer.config();
  const ModelConfig& cc = consumer.config();
  SCD_RETURN_IF_ERROR(CheckPair(pc, cc, options));
  Stopwatch total, stage;
  CalibrationResult result;
  CalibrationReport& report = result.report;
  Artifact& artifact = result.artifact;
  SCD_ASSIGN_OR_RETURN(CalibrationData data,
                       LoadCalibrationData(pc, cc, tokenizer, options, &report.data));
  PairedTraces traces(pc, cc, options.reservoir_rows, options.seed);
  stage.Lap();
  SCD_RETURN_IF_ERROR(
      CollectPairedTraces(producer, consumer, data.prefixes, options.progress, &traces));
  report.seconds.traces = stage.Lap();

  SCD_ASSIGN_OR_RETURN(artifact.producer, ModelIdentity::Of(producer));
  SCD_ASSIGN_OR_RETURN(artifact.consumer, ModelIdentity::Of(consumer));
  artifact.fit_method = FitMethodName(options.fit_method);
  std::vector<ReuseTranslator> bases;
  SCD_RETURN_IF_ERROR(FitTranslators(traces, options, &artifact, &bases));
  report.seconds.translators = stage.Lap();

  const FidelityOptions fo{options.heldout_prefix, options.heldout_continuation, 0};
  SCD_ASSIGN_OR_RETURN(FidelityEvaluator heldout,
                       FidelityEvaluator::Create(consumer, data.heldout, fo));
  SCD_RETURN_IF_ERROR(SelectLayerPolicies(producer, consumer, artifact, heldout, options, &report));
  artifact.recompute_layers = report.recompute_policy.chosen;
  report.seconds.policy = stage.Lap();

  SCD_RETURN_IF_ERROR(TrainPatchAligners(consumer, traces, bases, report.patch_policy.chosen,
                                         options, &artifact, &report.aligners));
  report.seconds.aligners = stage.Lap();

  SCD_ASSIGN_OR_RETURN(report.fidelity, MeasureFidelity(producer, consumer, artifact, heldout));
  report.seconds.fidelity = stage.Lap();
  report.fidelity_split = HeldoutSplitName(options);
  if (options.frontier) {
    FrontierFitOptions fo = options.frontier_fit;
    fo.progress = options.progress;
    FrontierFitTrace trace;
    SCD_RETURN_IF_ERROR(FitFrontierInto(producer, consumer, &artifact, heldout, fo, &trace));
    artifact.frontier.heldout = report.fidelity_split;
    report.frontier_evaluations = trace.evaluations + trace.head_evaluations;
    report.seconds.frontier = stage.Lap();
  }
  FillSettings(options, traces, artifact, &report);
  report.seconds.total = total.Seconds();
  artifact.calibration_json = CalibrationJson(report).dump();
  artifact.policy_json = PolicyJson(report).dump();
  artifact.fidelity_json = FidelityJson(report).dump();
  return result;
}

std::string FormatFitSummary(const std::string& artifact_path, const CalibrationResult& result) {
  const Artifact& artifact = result.artifact;
  const CalibrationReport& report = result.report;
  std::string out = absl::StrFormat("wrote %s (%s -> %s)\n", artifact_path, artifact.producer.name,
                                    artifact.consumer.name);
  for (size_t l = 0; l < artifact.layers.size(); ++l) {
    const ArtifactLayer& a = artifact.layers[l];
    absl::StrAppendFormat(&out, "  layer %d  %-5s  r_K %2d  r_V %2d%s\n", l,
                          LayerRouteName(a.route), a.key.rank(), a.value.rank(),
                          a.patch ? absl::StrFormat("  r_H %3d", a.patch->rank()) : "");
  }
  absl::StrAppendFormat(&out, "held-out fidelity (%s):\n", report.fidelity_split);
  for (const ModeFidelity& f : report.fidelity) {
    absl::StrAppendFormat(&out,
                          "  %-6s KL %.4f  PPL/oracle %.3f  top1 %.3f  payload %.1f%% of raw f16\n",
                          TransferModeName(f.mode), f.metrics.kl, f.metrics.ppl_ratio(),
                          f.metrics.top1, 100 * f.payload_ratio);
  }
  if (!artifact.frontier.empty()) {
    absl::StrAppendFormat(&out, "frontier (%d held-out evaluations, %.1f s):\n%s",
                          report.frontier_evaluations, report.seconds.frontier,
                          FormatFrontier(artifact.frontier));
  }
  absl::StrAppendFormat(&out, "calibration took %.1f s\n", report.seconds.total);
  return out;
}

}  // namespace scd
