#include "base/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"

namespace scd {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                   "#ff7f0e", "#9467bd", "#8c564b"};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// About five round tick values covering [lo, hi].
std::vector<double> Ticks(double lo, double hi) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

// Ticks for a log-10 axis spanning [lo, hi] (in log units): round values 1, 2, 5 x 10^k, or
// finer mantissas when the span is under a decade. Returned in log units.
std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> t;
  for (const std::vector<double>& mantissas :
       {std::vector<double>{1, 2, 5}, std::vector<double>{1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    t.clear();
    for (int e = static_cast<int>(std::floor(lo)) - 1; e <= static_cast<int>(std::ceil(hi)); ++e) {
      for (double m : mantissas) {
        const double v = std::log10(m) + e;
        if (v >= lo && v <= hi) t.push_back(v);
      }
    }
    if (t.size() >= 3) return t;
  }
  // Less than about a factor of two: round values of the linear scale, placed logarithmically.
  t.clear();
  for (double v : Ticks(std::pow(10, lo), std::pow(10, hi))) {
    if (v > 0) t.push_back(std::log10(v));
  }
  return t;
}

}  // namespace

SvgPlot::SvgPlot(std::string title, std::string x_label, std::string y_label)
    : title_(std::move(title)), x_label_(std::move(x_label)), y_label_(std::move(y_label)) {}

void SvgPlot::AddLine(std::string name, std::vector<double> xs, std::vector<double> ys) {
  series_.push_back({std::move(name), std::move(xs), std::move(ys), true});
}

void SvgPlot::AddPoints(std::string name, std::vector<double> xs, std::vector<double> ys) {
  series_.push_back({std::move(name), std::move(xs), std::move(ys), false});
}

void SvgPlot::AddVerticalMarker(double x, std::string label) {
  markers_.emplace_back(x, std::move(label));
}

std::string SvgPlot::Render(int width, int height) const {
  const double left = 70, right = 170, top = 40, bottom = 55;
  const double pw = width - left - right, ph = height - top - bottom;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  auto ty = [&](double y) { return log_y_ ? std::log10(std::max(y, 1e-12)) : y; };
  for (const Series& s : series_) {
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
      x_lo = std::min(x_lo, s.xs[i]);
      x_hi = std::max(x_hi, s.xs[i]);
      y_lo = std::min(y_lo, ty(s.ys[i]));
      y_hi = std::max(y_hi, ty(s.ys[i]));
    }
  }
  for (const auto& [x, label] : markers_) {
    x_lo = std::min(x_lo, x);
    x_hi = std::max(x_hi, x);
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi == x_lo) x_hi = x_lo + 1;
  if (y_hi == y_lo) y_hi = y_lo + 1;
  const double y_pad = (y_hi - y_lo) * 0.05;
  y_lo -= y_pad;
  y_hi += y_pad;
  if (!log_y_ && y_lo > 0 && y_lo < (y_hi - y_lo)) y_lo = 0;
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double y) { return top + (1 - (ty(y) - y_lo) / (y_hi - y_lo)) * ph; };
  auto py_raw = [&](double v) { return top + (1 - (v - y_lo) / (y_hi - y_lo)) * ph; };

  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%g\" y=\"22\" font-size=\"15\">%s</text>\n",
      width, height, left, Escape(title_));
  absl::StrAppendFormat(
      &s, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#444\"/>\n",
      left, top, pw, ph);
  for (double t : Ticks(x_lo, x_hi)) {
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%g</text>\n",
                          px(t), top, px(t), top + ph, px(t), top + ph + 16, t);
  }
  for (double t : log_y_ ? LogTicks(y_lo, y_hi) : Ticks(y_lo, y_hi)) {
    const double value = log_y_ ? std::pow(10, t) : (std::abs(t) < 1e-12 ? 0.0 : t);
    const std::string label = absl::StrFormat("%.3g", value);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          left, py_raw(t), left + pw, py_raw(t), left - 6, py_raw(t) + 4, label);
  }
  absl::StrAppendFormat(&s, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                        left + pw / 2, height - 14, Escape(x_label_));
  absl::StrAppendFormat(
      &s, "<text transform=\"translate(18,%g) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
      top + ph / 2, Escape(y_label_ + (log_y_ ? " (log)" : "")));
  for (const auto& [x, label] : markers_) {
    absl::StrAppendFormat(
        &s,
        "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#888\" "
        "stroke-dasharray=\"5,4\"/><text x=\"%.1f\" y=\"%g\" fill=\"#666\">%s</text>\n",
        px(x), top, px(x), top + ph, px(x) + 3, top + 12, Escape(label));
  }
  for (size_t i = 0; i < series_.size(); ++i) {
    const Series& ser = series_[i];
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    if (ser.line && ser.xs.size() > 1) {
      std::string pts;
      for (size_t j = 0; j < ser.xs.size(); ++j)
        absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(ser.xs[j]), py(ser.ys[j]));
      absl::StrAppendFormat(
          &s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", color,
          pts);
    }
    for (size_t j = 0; j < ser.xs.size(); ++j) {
      absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\"/>\n",
                            px(ser.xs[j]), py(ser.ys[j]), ser.line ? 3 : 4, color);
    }
    const double ly = top + 14 + 18 * static_cast<double>(i);
    absl::StrAppendFormat(&s,
                          "<rect x=\"%g\" y=\"%g\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%g\" y=\"%g\">%s</text>\n",
                          left + pw + 12, ly - 10, color, left + pw + 30, ly, Escape(ser.name));
  }
  s += "</svg>\n";
  return s;
}

absl::Status SvgPlot::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Render());
}

}  // namespace scd
