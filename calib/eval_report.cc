#include "calib/eval_report.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/plot_script.h"

namespace scd {

namespace fs = std::filesystem;

absl::StatusOr<std::string> WriteDepthErrors(Evaluation& eval, const Artifact& artifact,
                                             const TransferOptions& transfer,
                                             const std::string& out_dir) {
  std::string text;
  SCD_ASSIGN_OR_RETURN(std::vector<double> reuse, eval.DepthErrors(TransferMode::kReuse, transfer));
  SCD_ASSIGN_OR_RETURN(std::vector<double> scd, eval.DepthErrors(TransferMode::kScd, transfer));
  std::string csv = "layer,reuse_rel_error,scd_rel_error,route\n";
  for (size_t l = 0; l < reuse.size(); ++l) {
    absl::StrAppendFormat(&csv, "%d,%.6g,%.6g,%s\n", l, reuse[l], scd[l],
                          LayerRouteName(artifact.layers[l].route));
  }
  const std::string base = (fs::path(out_dir) / "depth_errors").string();
  SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
  SCD_RETURN_IF_ERROR(RunPlotScript(
      "plot_calib.py", {"depth", base + ".csv", "--out", base + ".png", "--title",
                        absl::StrCat("Attention-input error by depth: ", artifact.producer.name,
                                     " -> ", artifact.consumer.name)}));
  absl::StrAppendFormat(&text, "\ndepth errors (relative l2 of each layer's attention input):\n%s",
                        csv.c_str());
  absl::StrAppendFormat(&text, "wrote %s.csv and %s.png\n", base.c_str(), base.c_str());
  return text;
}

absl::StatusOr<std::string> WriteRankSweep(Evaluation& eval, const Artifact& artifact,
                                           const TransferOptions& transfer,
                                           const std::string& out_dir) {
  std::string text;
  const TransferMode mode =
      artifact.PatchLayers().empty() ? TransferMode::kReuse : TransferMode::kScd;
  SCD_ASSIGN_OR_RETURN(std::vector<RankSweepPoint> points, eval.RankSweep(mode, transfer));
  std::string csv = "mode,rank_k,rank_v,rank_h,bytes_per_token,payload_ratio,kl,ppl_ratio,pareto\n";
  for (const RankSweepPoint& p : points) {
    absl::StrAppendFormat(&csv, "%s,%d,%d,%d,%.2f,%.5f,%.6g,%.5f,%d\n", TransferModeName(mode),
                          p.rank_k, p.rank_v, p.rank_h, p.metrics.bytes_per_token, p.payload_ratio,
                          p.metrics.kl, p.metrics.ppl_ratio(), p.pareto ? 1 : 0);
  }
  const std::string base = (fs::path(out_dir) / "rank_sweep").string();
  SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
  SCD_RETURN_IF_ERROR(RunPlotScript(
      "plot_calib.py", {"rank", base + ".csv", "--out", base + ".png", "--title",
                        absl::StrCat("KL vs payload (", TransferModeName(mode), ", nested ranks): ",
                                     artifact.producer.name, " -> ", artifact.consumer.name)}));
  absl::StrAppendFormat(&text, "\nrank sweep:\n%swrote %s.csv and %s.png\n", csv.c_str(),
                        base.c_str(), base.c_str());
  return text;
}

absl::StatusOr<std::string> WriteFrontierEval(Evaluation& eval, const Artifact& artifact,
                                              const std::string& out_dir) {
  if (artifact.frontier.empty()) {
    return absl::FailedPreconditionError(
        "the artifact has no frontier (scd-calib frontier --artifact FILE fits one)");
  }
  std::string csv = "kind,label,code_dtype,bytes_per_token,payload_ratio,kl,fit_kl,ppl_ratio\n";
  std::vector<ModeResult> points;
  for (size_t i = 0; i < artifact.frontier.points.size(); ++i) {
    const FrontierPoint& p = artifact.frontier.points[i];
    SCD_ASSIGN_OR_RETURN(ModeResult r,
                         eval.Run(TransferMode::kScd, TransferOptions::AtPoint(p), false));
    const bool recommended = static_cast<int>(i) == artifact.frontier.recommended;
    absl::StrAppendFormat(&csv, "frontier,%s%d,%s,%.2f,%.5f,%.6g,%.6g,%.5f\n",
                          recommended ? "*" : "", i, WireDtypeName(p.code_dtype),
                          r.metrics.bytes_per_token, r.payload_ratio(), r.metrics.kl, p.kl,
                          r.metrics.ppl_ratio());
    points.push_back(r);
  }
  std::string text = "\nfrontier on these windows, against each fixed mode at its bytes:\n";
  absl::StrAppendFormat(&text, "%-8s %10s %9s   %-26s %10s %9s\n", "mode", "bytes/tok", "KL",
                        "frontier point <= bytes", "bytes/tok", "KL");
  const std::vector<TransferMode> fixed = {TransferMode::kScd, TransferMode::kReuse,
                                           TransferMode::kInt4, TransferMode::kRaw};
  for (TransferMode mode : fixed) {
    SCD_ASSIGN_OR_RETURN(ModeResult r, eval.Run(mode, TransferOptions(), false));
    absl::StrAppendFormat(&csv, "mode,%s,%s,%.2f,%.5f,%.6g,,%.5f\n", TransferModeName(mode),
                          mode == TransferMode::kInt4 ? "int4" : "f16", r.metrics.bytes_per_token,
                          r.payload_ratio(), r.metrics.kl, r.metrics.ppl_ratio());
    int best = -1;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].metrics.bytes_per_token <= r.metrics.bytes_per_token &&
          (best < 0 || points[i].metrics.kl < points[best].metrics.kl)) {
        best = static_cast<int>(i);
      }
    }
    const std::string under =
        best < 0 ? "none"
                 : absl::StrCat("#", best, " ", artifact.frontier.points[best].Describe());
    absl::StrAppendFormat(&text, "%-8s %10.1f %9.4f   %-26s", TransferModeName(mode),
                          r.metrics.bytes_per_token, r.metrics.kl, under.substr(0, 26));
    if (best >= 0) {
      absl::StrAppendFormat(&text, " %10.1f %9.4f%s", points[best].metrics.bytes_per_token,
                            points[best].metrics.kl,
                            points[best].metrics.kl <= r.metrics.kl ? "" : "  (worse)");
    }
    text += "\n";
  }
  const std::string base = (fs::path(out_dir) / "frontier").string();
  SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
  SCD_RETURN_IF_ERROR(RunPlotScript(
      "plot_calib.py", {"frontier", base + ".csv", "--out", base + ".png", "--title",
                        absl::StrCat("Quality against bytes: ", artifact.producer.name, " -> ",
                                     artifact.consumer.name)}));
  absl::StrAppendFormat(&text, "%swrote %s.csv and %s.png\n", csv.c_str(), base.c_str(),
                        base.c_str());
  return text;
}

}  // namespace scd
