// Link shaper: makes any Link behave like a slower, longer one, for bandwidth sweeps on one
// machine. Data frames pass a token bucket of `gbps` (burst `burst_bytes`); every frame is
// delivered to the inner link `latency` after it leaves the bucket (one-way latency). Control
// frames skip the bucket (they are small and must not wait behind bulk) but get the latency.
// Thread-safety: the shaped Link is thread-safe like any Link.
#ifndef SCD_TRANSPORT_LINK_SHAPER_H_
#define SCD_TRANSPORT_LINK_SHAPER_H_

#include <cstddef>
#include <memory>

#include "absl/time/time.h"
#include "transport/transport.h"

namespace scd::transport {

struct LinkShape {
  double gbps = 0;  // 0 = unlimited
  absl::Duration latency = absl::ZeroDuration();
  size_t burst_bytes = size_t{64} << 10;
  // Wrap the link even while the shape is disabled, so that a later Link::Reshape reaches it
  // (a link that may be shaped during its life: a bench's rate trace).
  bool reshapable = false;
  bool enabled() const { return gbps > 0 || latency > absl::ZeroDuration(); }
};

// Wraps `inner` (unless the shape is disabled and not reshapable); what is sent through the
// result is shaped (what arrives is not).
std::unique_ptr<Link> ShapeLink(std::unique_ptr<Link> inner, LinkShape shape);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_LINK_SHAPER_H_
