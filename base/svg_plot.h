// SvgPlot: a small dependency-free line/scatter plot written as SVG (depth-error and rank-sweep
// figures of scd-calib eval). Linear x axis; linear or log-10 y axis.
// Thread-safety: not thread-safe.
#ifndef SCD_BASE_SVG_PLOT_H_
#define SCD_BASE_SVG_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace scd {

class SvgPlot {
 public:
  SvgPlot(std::string title, std::string x_label, std::string y_label);

  void SetLogY(bool log_y) { log_y_ = log_y; }
  void AddLine(std::string name, std::vector<double> xs, std::vector<double> ys);
  void AddPoints(std::string name, std::vector<double> xs, std::vector<double> ys);
  // A dashed vertical line (e.g. a patched layer).
  void AddVerticalMarker(double x, std::string label);

  std::string Render(int width = 760, int height = 460) const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Series {
    std::string name;
    std::vector<double> xs, ys;
    bool line;
  };
  std::string title_, x_label_, y_label_;
  bool log_y_ = false;
  std::vector<Series> series_;
  std::vector<std::pair<double, std::string>> markers_;
};

}  // namespace scd

#endif  // SCD_BASE_SVG_PLOT_H_
