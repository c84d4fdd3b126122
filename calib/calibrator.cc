#include "calib/calibrator.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "calib/fidelity.h"
#include "calib/paired_traces.h"
#include "calib/text_corpus.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"

namespace scd {
namespace {

using Json = nlohmann::json;

// What the layer-policy search needs of one held-out window, computed once.
// Every variant of a layer's prefix cache that the policy searches combine, built once: the
// translators do not change during the search.
struct HeldoutPrefix {
  std::vector<at::Tensor> oracle_k, oracle_v;  // the consumer's own cache, post-RoPE
  std::vector<at::Tensor> raw_k, raw_v;        // the producer's pre-RoPE K, V as sent (f16)
  std::vector<at::Tensor> reuse_k, reuse_v;    // reuse-decoded from f16 codes, pre-RoPE
};

// Models what travels: codes and raw tensors go over the wire in f16.
at::Tensor F16(const at::Tensor& t) { return t.to(at::kHalf).to(at::kFloat); }

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

absl::StatusOr<Artifact> Calibrate(const LlamaModel& producer, const LlamaModel& consumer,
                                   const Tokenizer& tokenizer, const CalibrationOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& pc = producer.config();
  const ModelConfig& cc = consumer.config();
  if (pc.num_layers != cc.num_layers || pc.num_kv_heads != cc.num_kv_heads ||
      pc.head_dim != cc.head_dim || pc.hidden_size != cc.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "producer and consumer must share the architecture: layers ", pc.num_layers, "/",
        cc.num_layers, ", kv heads ", pc.num_kv_heads, "/", cc.num_kv_heads, ", head_dim ",
        pc.head_dim, "/", cc.head_dim, ", hidden ", pc.hidden_size, "/", cc.hidden_size));
  }
  const int layers = static_cast<int>(cc.num_layers);
  const int64_t max_len = std::min(pc.max_position_embeddings, cc.max_position_embeddings);
  const int heldout_len = options.heldout_prefix + options.heldout_continuation + 1;
  if (options.tokens > max_len || heldout_len > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefixes of ", options.tokens, " and windows of ", heldout_len,
                     " tokens exceed the models' ", max_len, " positions"));
  }
  Json timings = Json::object();

  // 1. Data: calibration prefixes from the first 90 % of the documents, the held-out split
  //    from the rest.
  SCD_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::Load(options.data_path, tokenizer));
  SCD_ASSIGN_OR_RETURN(auto prefixes, corpus.Sequences(options.prefixes, options.tokens, 0.0, 0.9));
  SCD_ASSIGN_OR_RETURN(auto heldout,
                       corpus.Sequences(options.heldout_windows, heldout_len, 0.9, 1.0));
  int sweep_sequences = 0;
  if (options.vocab_sweep) {
    std::vector<TokenId> ids;
    const int64_t vocab = std::min(pc.vocab_size, cc.vocab_size);
    for (TokenId id = 0; id < vocab; ++id) {
      if (!tokenizer.IsSpecial(id) && id != tokenizer.bos_token_id().value_or(-1))
        ids.push_back(id);
    }
    std::mt19937_64 rng(options.seed + 7);
    std::shuffle(ids.begin(), ids.end(), rng);
    const size_t body = static_cast<size_t>(options.tokens) - 1;
    for (size_t i = 0; i < ids.size(); i += body) {
      std::vector<TokenId> seq;
      if (tokenizer.bos_token_id()) seq.push_back(*tokenizer.bos_token_id());
      for (size_t j = i; j < std::min(ids.size(), i + body); ++j) seq.push_back(ids[j]);
      // A short tail borrows from the start so that every sequence has the same length.
      for (size_t j = 0; seq.size() < static_cast<size_t>(options.tokens); ++j)
        seq.push_back(ids[j]);
      prefixes.push_back(std::move(seq));
      ++sweep_sequences;
    }
  }

  // 2. Paired traces.
  auto stage = std::chrono::steady_clock::now();
  PairedTraces traces(pc, cc, options.reservoir_rows, options.seed);
  {
    const CaptureSpec capture = CaptureSpec::All(cc);
    Progress progress("paired prefills", static_cast<int64_t>(prefixes.size()), options.progress);
    for (const auto& prefix : prefixes) {
      KvCache a_cache = producer.NewCache(options.tokens),
              b_cache = consumer.NewCache(options.tokens);
      SCD_ASSIGN_OR_RETURN(
          ForwardOutput a,
          producer.Forward(prefix, &a_cache, {.logits = LogitsMode::kNone, .capture = &capture}));
      SCD_ASSIGN_OR_RETURN(
          ForwardOutput b,
          consumer.Forward(prefix, &b_cache, {.logits = LogitsMode::kNone, .capture = &capture}));
      SCD_RETURN_IF_ERROR(traces.Add(a.captures, b.captures));
      progress.Advance();
    }
  }
  timings["traces"] = SecondsSince(stage);

  // 3. Translators for every layer, and hidden-state bases.
  stage = std::chrono::steady_clock::now();
  Artifact artifact;
  SCD_ASSIGN_OR_RETURN(artifact.producer, ModelIdentity::Of(producer));
  SCD_ASSIGN_OR_RETURN(artifact.consumer, ModelIdentity::Of(consumer));
  artifact.fit_method = FitMethodName(options.fit_method);
  std::vector<ReuseTranslator> bases(layers);
  for (int l = 0; l < layers; ++l) {
    auto grams = [&](const std::vector<GramStats>& per_head) {
      return options.per_head ? per_head : std::vector<GramStats>{PairedTraces::Merged(per_head)};
    };
    TranslatorFitOptions kv{options.fit_method, options.rank_k, options.energy, options.ridge};
    ArtifactLayer layer;
    SCD_ASSIGN_OR_RETURN(layer.key, ReuseTranslator::Fit(grams(traces.key_grams(l)), kv));
    kv.rank = options.rank_v;
    SCD_ASSIGN_OR_RETURN(layer.value, ReuseTranslator::Fit(grams(traces.value_grams(l)), kv));
    TranslatorFitOptions h{options.hidden_basis, options.rank_h, options.energy, options.ridge};
    SCD_ASSIGN_OR_RETURN(bases[l], ReuseTranslator::Fit({traces.hidden_grams(l)}, h));
    artifact.layers.push_back(std::move(layer));
  }
  timings["translators"] = SecondsSince(stage);

  // 4. Layer policies on the held-out split: F(S) = -KL with the layers in S restored to the
  //    oracle and every other layer reuse-decoded (patch) or raw (recompute baseline).
  stage = std::chrono::steady_clock::now();
  FidelityOptions fo{options.heldout_prefix, options.heldout_continuation, /*greedy_tokens=*/0};
  SCD_ASSIGN_OR_RETURN(FidelityEvaluator evaluator,
                       FidelityEvaluator::Create(consumer, heldout, fo));
  std::vector<HeldoutPrefix> held(heldout.size());
  {
    const CaptureSpec capture = CaptureSpec::All(cc);
    for (size_t i = 0; i < heldout.size(); ++i) {
      const std::vector<TokenId> prefix = evaluator.Prefix(static_cast<int>(i));
      KvCache a_cache = producer.NewCache(fo.prefix), b_cache = consumer.NewCache(fo.prefix);
      SCD_ASSIGN_OR_RETURN(
          ForwardOutput a,
          producer.Forward(prefix, &a_cache, {.logits = LogitsMode::kNone, .capture = &capture}));
      SCD_RETURN_IF_ERROR(
          consumer.Forward(prefix, &b_cache, {.logits = LogitsMode::kNone}).status());
      for (int l = 0; l < layers; ++l) {
        const LayerCapture& c = a.captures.at(l);
        const ArtifactLayer& t = artifact.layers[l];
        held[i].oracle_k.push_back(b_cache.keys(l).clone());
        held[i].oracle_v.push_back(b_cache.values(l).clone());
        held[i].raw_k.push_back(F16(c.key_prerope));
        held[i].raw_v.push_back(F16(c.value));
        held[i].reuse_k.push_back(
            F16(t.key.Decode(F16(t.key.Encode(c.key_prerope, t.key.rank())))));
        held[i].reuse_v.push_back(
            F16(t.value.Decode(F16(t.value.Encode(c.value, t.value.rank())))));
      }
    }
  }
  auto restored_score = [&](bool raw_base, Progress* progress) -> RestoredSetScore {
    return [&, raw_base, progress](const std::vector<int>& restored) -> absl::StatusOr<double> {
      auto build = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
        *bytes = 0;
        const HeldoutPrefix& hp = held[w];
        for (int l = 0; l < layers; ++l) {
          if (Contains(restored, l)) {
            SCD_RETURN_IF_ERROR(consumer.LoadPrefix(l, hp.oracle_k[l], hp.oracle_v[l],
                                                    KeyFormat::kPostRope, cache));
            continue;
          }
          const auto& k = raw_base ? hp.raw_k : hp.reuse_k;
          const auto& v = raw_base ? hp.raw_v : hp.reuse_v;
          SCD_RETURN_IF_ERROR(consumer.LoadPrefix(l, k[l], v[l], KeyFormat::kPreRope, cache));
        }
        return absl::OkStatus();
      };
      SCD_ASSIGN_OR_RETURN(FidelityMetrics m, evaluator.Evaluate(build, /*greedy=*/false));
      if (progress != nullptr) {
        progress->Advance();
        progress->SetDetail(absl::StrFormat("KL %.4f", m.kl));
      }
      return -m.kl;
    };
  };
  const int k_cap =
      std::min(layers, options.policy.fixed_k > 0 ? options.policy.fixed_k : options.policy.k_max);
  const int pool = options.policy.pool > 0 ? std::min(options.policy.pool, layers) : layers;
  const int policy_evals = 1 + layers + k_cap * pool;
  LayerPolicyResult patch_policy, recompute_policy;
  {
    Progress progress("patch-layer policy", policy_evals, options.progress);
    SCD_ASSIGN_OR_RETURN(patch_policy,
                         SelectLayers(layers, restored_score(false, &progress), options.policy));
  }
  LayerPolicyOptions recompute_options = options.policy;
  recompute_options.fixed_k =
      options.recompute_layers > 0 ? options.recompute_layers : std::max(1, patch_policy.k);
  {
    Progress progress("recompute-baseline policy", 1 + layers + recompute_options.fixed_k * pool,
                      options.progress);
    SCD_ASSIGN_OR_RETURN(recompute_policy,
                         SelectLayers(layers, restored_score(true, &progress), recompute_options));
  }
  timings["policy"] = SecondsSince(stage);

  // 5. Aligners for the patch layers.
  stage = std::chrono::steady_clock::now();
  Json aligner_reports = Json::object();
  for (int l : patch_policy.chosen) {
    const LayerWeights& w = consumer.weights().layers[l];
    at::Tensor kv_weight = at::cat({w.Wk(cc), w.Wv(cc)}, 0).to(at::kCPU, at::kFloat);
    AlignerTrainOptions ao = options.aligner;
    ao.seed = options.seed + static_cast<uint64_t>(l);
    AlignerTrainReport report;
    Progress progress(absl::StrCat("aligner layer ", l), ao.max_epochs, options.progress);
    SCD_ASSIGN_OR_RETURN(
        PatchAligner aligner,
        TrainAligner(bases[l], traces.hidden_a(l), traces.hidden_b(l), kv_weight, ao, &report,
                     [&](int, double loss) {
                       progress.Advance();
                       progress.SetDetail(absl::StrFormat("held-out loss %.4g", loss));
                     }));
    progress.Done();
    spdlog::info("aligner layer {}: held-out loss {:.4g} (linear {:.4g}), {} epochs, {:.1f} s", l,
                 report.heldout, report.linear_heldout, report.epochs, report.seconds);
    artifact.layers[l].route = LayerRoute::kPatch;
    artifact.layers[l].patch = std::move(aligner);
    aligner_reports[std::to_string(l)] = Json::parse(report.ToJson());
  }
  timings["aligners"] = SecondsSince(stage);

  Json policy = {{"patch", Json::parse(patch_policy.ToJson())},
                 {"recompute", Json::parse(recompute_policy.ToJson())},
                 {"recompute_layers", recompute_policy.chosen},
                 {"score", "-KL(oracle || mode) on the held-out split"}};
  artifact.policy_json = policy.dump();

  // 6. Fidelity of the fitted artifact on the held-out split, through the real codec.
  stage = std::chrono::steady_clock::now();
  Json fidelity = Json::object();
  for (TransferMode mode : {TransferMode::kRaw, TransferMode::kReuse, TransferMode::kScd}) {
    SCD_ASSIGN_OR_RETURN(TransferPlan plan, TransferPlan::Make(mode, pc, &artifact, {}));
    CodeEncoder encoder(plan, &artifact, {});
    CodeDecoder decoder(consumer, &artifact);
    auto build = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
      const std::vector<TokenId> prefix = evaluator.Prefix(w);
      SCD_ASSIGN_OR_RETURN(CodeBatch batch, encoder.Prefill(producer, prefix));
      *bytes = batch.bytes();
      return decoder.Decode(batch, prefix, cache);
    };
    SCD_ASSIGN_OR_RETURN(FidelityMetrics m, evaluator.Evaluate(build, false));
    Json j = Json::parse(m.ToJson());
    j["payload_ratio"] = m.bytes_per_token / static_cast<double>(cc.KvBytesPerToken(2));
    fidelity[TransferModeName(mode)] = j;
  }
  timings["fidelity"] = SecondsSince(stage);
  fidelity["split"] = absl::StrCat(
      "held-out: last 10% of ", std::filesystem::path(options.data_path).filename().string(), ", ",
      options.heldout_windows, " windows of ", options.heldout_prefix, "+",
      options.heldout_continuation, " tokens");
  artifact.fidelity_json = fidelity.dump();

  Json ranks = Json::array();
  for (int l = 0; l < layers; ++l) {
    ranks.push_back({{"k", artifact.layers[l].key.rank()},
                     {"v", artifact.layers[l].value.rank()},
                     {"h", artifact.layers[l].patch ? artifact.layers[l].patch->rank() : 0}});
  }
  timings["total"] = SecondsSince(start);
  Json calibration = {
      {"data", options.data_path},
      {"prefixes", options.prefixes},
      {"vocab_sweep_sequences", sweep_sequences},
      {"tokens", options.tokens},
      {"rows", traces.rows_seen()},
      {"heldout_windows", options.heldout_windows},
      {"fit_method", FitMethodName(options.fit_method)},
      {"hidden_basis", FitMethodName(options.hidden_basis)},
      {"energy", options.energy},
      {"ridge", options.ridge},
      {"per_head", options.per_head},
      {"ranks", ranks},
      {"aligner",
       {{"width", options.aligner.shape.width},
        {"depth", options.aligner.shape.depth},
        {"loss", options.aligner.loss == AlignerTrainOptions::Loss::kKeyValue ? "kv" : "hidden"},
        {"reports", aligner_reports}}},
      {"seed", options.seed},
      {"seconds", timings}};
  artifact.calibration_json = calibration.dump();
  return artifact;
}

}  // namespace scd
