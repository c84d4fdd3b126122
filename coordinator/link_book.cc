#include "coordinator/link_book.h"

#include "absl/strings/str_format.h"

namespace scd::coordinator {

void LinkBook::NoteShape(const std::string& producer, const v1::LinkShape& shape,
                         absl::Time now) {
  absl::MutexLock lock(&mu_);
  Shape& s = shapes_[producer];
  s.set = now;
  s.announced = shape.gbps() > 0;
  if (shape.gbps() > 0) {
    s.shape = shape;
  } else {
    s.shape.reset();
  }
}

void LinkBook::Observe(const std::string& producer, const std::string& consumer,
                       absl::Time routed_at, const v1::Finished& finished, absl::Time now) {
  absl::MutexLock lock(&mu_);
  measured_[{producer, consumer}].Observe(finished, now);
  Shape& s = shapes_[producer];
  if (routed_at < s.set) return;  // travelled under the shape before the last one set
  if (finished.has_link() && finished.link().gbps() > 0) {
    s.shape = finished.link();
    s.learnt = now;
  } else {
    s.shape.reset();
    s.announced = false;
  }
}

LinkBook::Link LinkBook::For(const std::string& producer, const std::string& consumer,
                             absl::Time now) const {
  absl::MutexLock lock(&mu_);
  Link link;
  auto shape = shapes_.find(producer);
  if (shape != shapes_.end() && shape->second.shape.has_value() &&
      (shape->second.announced || now - shape->second.learnt <= learnt_max_age_)) {
    const v1::LinkShape& s = *shape->second.shape;
    link.goodput_bytes_per_s = s.gbps() * 1e9 / 8;
    link.latency_us = s.latency_us();
    // No burst: the shaper's bucket is only full after the link idled (back-to-back transfers
    // find it empty), so the rate is taken from the first byte.
    link.how = absl::StrFormat("%g Gbit/s as shaped", s.gbps());
  } else if (auto it = measured_.find({producer, consumer});
             it != measured_.end() && it->second.Known(now)) {
    link.goodput_bytes_per_s = it->second.goodput_bytes_per_s();
    link.latency_us = it->second.latency_us();
    link.how = absl::StrFormat("%.3g Gbit/s as measured", link.goodput_bytes_per_s * 8 / 1e9);
  } else {
    link.how = "never seen holding a transfer back: taken as unlimited";
  }
  return link;
}

void LinkBook::Forget(const std::string& node) {
  absl::MutexLock lock(&mu_);
  shapes_.erase(node);
  for (auto it = measured_.begin(); it != measured_.end();) {
    const bool either = it->first.first == node || it->first.second == node;
    it = either ? measured_.erase(it) : std::next(it);
  }
}

}  // namespace scd::coordinator
