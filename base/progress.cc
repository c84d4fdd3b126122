#include "base/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace scd {

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
                   : absl::StrFormat("%d:%02d", s / 60, s % 60);
}

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  Draw(true);
}

Progress::~Progress() { Done(); }

void Progress::Advance(int64_t n) {
  done_ = std::min(total_, done_ + n);
  Draw(false);
}

void Progress::SetDetail(std::string detail) {
  detail_ = std::move(detail);
  Draw(false);
}

void Progress::Done() {
  if (finished_) return;
  done_ = total_;
  Draw(true);
  finished_ = true;
  if (enabled_ && tty_) std::fputc('\n', stderr);
}

void Progress::Draw(bool force) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = static_cast<double>(done_) / total_;
  const std::string eta =
      done_ > 0 && done_ < total_ ? FormatDuration(elapsed / fraction - elapsed) : "-";
  if (tty_) {
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 28;
    const int fill = static_cast<int>(fraction * kWidth);
    std::string bar(fill, '=');
    if (fill < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %ld/%ld elapsed %s eta %s %s", label_.c_str(),
                 bar.c_str(), 100 * fraction, static_cast<long>(done_), static_cast<long>(total_),
                 FormatDuration(elapsed).c_str(), eta.c_str(), detail_.c_str());
  } else {
    const int decile = static_cast<int>(fraction * 10);
    if (!force && decile == last_decile_) return;
    if (decile == last_decile_ && done_ < total_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3.0f%% (%ld/%ld) elapsed %s eta %s %s\n", label_.c_str(),
                 100 * fraction, static_cast<long>(done_), static_cast<long>(total_),
                 FormatDuration(elapsed).c_str(), eta.c_str(), detail_.c_str());
  }
  std::fflush(stderr);
  last_draw_ = now;
}

}  // namespace scd
