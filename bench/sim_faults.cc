#include "bench/sim_faults.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace scd::bench {

absl::Status FrozenSpans::Add(absl::Time from, absl::Time to) {
  if (!(from < to)) return absl::InvalidArgumentError("a freeze must last");
  auto at = std::lower_bound(spans_.begin(), spans_.end(), std::make_pair(from, to));
  const bool after_previous = at == spans_.begin() || std::prev(at)->second <= from;
  const bool before_next = at == spans_.end() || to <= at->first;
  if (!after_previous || !before_next) {
    return absl::InvalidArgumentError("two freezes of one node overlap");
  }
  spans_.insert(at, {from, to});
  return absl::OkStatus();
}

absl::Time FrozenSpans::ThawOf(absl::Time t) const {
  // The last span starting at or before t.
  auto at = std::upper_bound(spans_.begin(), spans_.end(), t,
                             [](absl::Time v, const auto& span) { return v < span.first; });
  if (at == spans_.begin()) return t;
  --at;
  return t < at->second ? at->second : t;
}

absl::Time FrozenSpans::EndOf(absl::Time start, absl::Duration work) const {
  absl::Time t = ThawOf(start);
  auto at = std::upper_bound(spans_.begin(), spans_.end(), t,
                             [](absl::Time v, const auto& span) { return v < span.first; });
  for (; at != spans_.end(); ++at) {
    const absl::Duration room = at->first - t;  // computing until the next freeze
    if (work <= room) break;
    work -= room;
    t = at->second;
  }
  return t + work;
}

absl::Duration FrozenSpans::Active(absl::Time from, absl::Time to) const {
  if (!(from < to)) return absl::ZeroDuration();
  absl::Duration active = to - from;
  for (const auto& [a, b] : spans_) {
    if (b <= from) continue;
    if (a >= to) break;
    active -= std::min(b, to) - std::max(a, from);
  }
  return active;
}

std::optional<absl::Time> KeepaliveGivesUp(absl::Time grid_start, absl::Duration interval,
                                           absl::Duration timeout, absl::Time from, absl::Time to) {
  if (interval <= absl::ZeroDuration() || from < grid_start) return std::nullopt;
  const absl::Time ping =
      grid_start + interval * std::ceil(absl::FDivDuration(from - grid_start, interval));
  const absl::Time deadline = ping + timeout;
  if (deadline >= to) return std::nullopt;  // the thaw answers it in time
  return deadline;
}

}  // namespace scd::bench
