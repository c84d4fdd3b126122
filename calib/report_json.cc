#include "calib/report_json.h"

#include <cmath>

namespace scd {

using Json = nlohmann::json;

Json ToJson(const FidelityMetrics& m) {
  Json j = {{"kl", m.kl},
            {"tv", m.tv},
            {"top1", m.top1},
            {"ppl", m.ppl},
            {"oracle_ppl", m.oracle_ppl},
            {"ppl_ratio", m.ppl_ratio()},
            {"greedy_agreement", m.greedy_agreement},
            {"bytes_per_token", m.bytes_per_token},
            {"positions", m.positions},
            {"windows", m.windows}};
  if (std::isnan(m.greedy_agreement)) j["greedy_agreement"] = nullptr;  // not measured
  return j;
}

Json ToJson(const LayerPolicyResult& p) {
  return {{"base_score", p.base},
          {"restore_one", p.restore_one},
          {"pool", p.pool},
          {"greedy_order", p.greedy_order},
          {"greedy_gain", p.greedy_gain},
          {"k", p.k},
          {"chosen", p.chosen}};
}

Json ToJson(const AlignerTrainReport& r) {
  return {{"train_rows", r.train_rows},
          {"heldout_rows", r.heldout_rows},
          {"linear_heldout_loss", r.linear_heldout},
          {"heldout_loss", r.heldout},
          {"epochs", r.epochs},
          {"seconds", r.seconds}};
}

Json ModeResultsJson(const std::vector<ModeResult>& results, Json context) {
  Json modes = Json::object();
  for (const ModeResult& r : results) {
    Json m = ToJson(r.metrics);
    m["payload_ratio"] = r.payload_ratio();
    m["raw_f16_bytes_per_token"] = r.raw_f16_bytes_per_token;
    modes[TransferModeName(r.mode)] = m;
  }
  context["modes"] = modes;
  return context;
}

Json CalibrationJson(const CalibrationReport& r) {
  Json ranks = Json::array();
  for (const LayerRanks& l : r.ranks) ranks.push_back({{"k", l.k}, {"v", l.v}, {"h", l.h}});
  Json aligners = Json::object();
  for (const auto& [layer, report] : r.aligners) aligners[std::to_string(layer)] = ToJson(report);
  const StageSeconds& s = r.seconds;
  return {{"data", r.data.path},
          {"prefixes", r.data.prefixes},
          {"vocab_sweep_sequences", r.data.vocab_sweep_sequences},
          {"tokens", r.data.tokens},
          {"rows", r.rows},
          {"heldout_windows", r.data.heldout_windows},
          {"fit_method", r.fit_method},
          {"hidden_basis", r.hidden_basis},
          {"energy", r.energy},
          {"ridge", r.ridge},
          {"per_head", r.per_head},
          {"ranks", ranks},
          {"aligner",
           {{"width", r.aligner_shape.width},
            {"depth", r.aligner_shape.depth},
            {"loss", r.aligner_loss},
            {"reports", aligners}}},
          {"seed", r.seed},
          {"frontier_evaluations", r.frontier_evaluations},
          {"seconds",
           {{"traces", s.traces},
            {"translators", s.translators},
            {"policy", s.policy},
            {"aligners", s.aligners},
            {"fidelity", s.fidelity},
            {"frontier", s.frontier},
            {"total", s.total}}}};
}

Json PolicyJson(const CalibrationReport& r) {
  return {{"patch", ToJson(r.patch_policy)},
          {"recompute", ToJson(r.recompute_policy)},
          {"recompute_layers", r.recompute_policy.chosen},
          {"score", "-KL(oracle || mode) on the held-out split"}};
}

Json FidelityJson(const CalibrationReport& r) {
  Json j = Json::object();
  for (const ModeFidelity& f : r.fidelity) {
    Json m = ToJson(f.metrics);
    m["payload_ratio"] = f.payload_ratio;
    j[TransferModeName(f.mode)] = m;
  }
  j["split"] = r.fidelity_split;
  return j;
}

}  // namespace scd
