#include "calib/eval_report.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/svg_plot.h"

namespace scd {

namespace fs = std::filesystem;

absl::StatusOr<std::string> WriteDepthErrors(Evaluation& eval, const Artifact& artifact,
                                             const TransferOptions& transfer,
                                             const std::string& out_dir) {
  std::string text;
  SCD_ASSIGN_OR_RETURN(std::vector<double> reuse, eval.DepthErrors(TransferMode::kReuse, transfer));
  SCD_ASSIGN_OR_RETURN(std::vector<double> scd, eval.DepthErrors(TransferMode::kScd, transfer));
  std::string csv = "layer,reuse_rel_error,scd_rel_error,route\n";
  std::vector<double> xs;
  for (size_t l = 0; l < reuse.size(); ++l) {
    absl::StrAppendFormat(&csv, "%d,%.6g,%.6g,%s\n", l, reuse[l], scd[l],
                          LayerRouteName(artifact.layers[l].route));
    xs.push_back(static_cast<double>(l));
  }
  const std::string base = (fs::path(out_dir) / "depth_errors").string();
  SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
  SvgPlot plot(absl::StrCat("Attention-input error by depth: ", artifact.producer.name, " -> ",
                            artifact.consumer.name),
               "layer", "relative l2 error of H");
  plot.AddLine("reuse", xs, reuse);
  plot.AddLine("scd", xs, scd);
  for (int l : artifact.PatchLayers()) plot.AddVerticalMarker(l, "patch");
  SCD_RETURN_IF_ERROR(plot.WriteFile(base + ".svg"));
  absl::StrAppendFormat(&text, "\ndepth errors (relative l2 of each layer's attention input):\n%s",
                        csv.c_str());
  absl::StrAppendFormat(&text, "wrote %s.csv and %s.svg\n", base.c_str(), base.c_str());
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
  std::vector<double> all_x, all_y, front_x, front_y;
  for (const RankSweepPoint& p : points) {
    absl::StrAppendFormat(&csv, "%s,%d,%d,%d,%.2f,%.5f,%.6g,%.5f,%d\n", TransferModeName(mode),
                          p.rank_k, p.rank_v, p.rank_h, p.metrics.bytes_per_token, p.payload_ratio,
                          p.metrics.kl, p.metrics.ppl_ratio(), p.pareto ? 1 : 0);
    all_x.push_back(100 * p.payload_ratio);
    all_y.push_back(p.metrics.kl);
  }
  std::vector<const RankSweepPoint*> front;
  for (const RankSweepPoint& p : points)
    if (p.pareto) front.push_back(&p);
  std::sort(front.begin(), front.end(),
            [](auto* a, auto* b) { return a->payload_ratio < b->payload_ratio; });
  for (const RankSweepPoint* p : front) {
    front_x.push_back(100 * p->payload_ratio);
    front_y.push_back(p->metrics.kl);
  }
  const std::string base = (fs::path(out_dir) / "rank_sweep").string();
  SCD_RETURN_IF_ERROR(WriteStringToFile(base + ".csv", csv));
  SvgPlot plot(absl::StrCat("KL vs payload (", TransferModeName(mode), ", nested ranks): ",
                            artifact.producer.name, " -> ", artifact.consumer.name),
               "payload, % of raw f16 KV", "KL(oracle || mode)");
  plot.SetLogY(true);
  plot.AddPoints("(r_K, r_V) grid", all_x, all_y);
  plot.AddLine("Pareto front", front_x, front_y);
  SCD_RETURN_IF_ERROR(plot.WriteFile(base + ".svg"));
  absl::StrAppendFormat(&text, "\nrank sweep:\n%swrote %s.csv and %s.svg\n", csv.c_str(),
                        base.c_str(), base.c_str());
  return text;
}

}  // namespace scd
