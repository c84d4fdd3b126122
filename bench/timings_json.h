// A request's server-side Timings (proto/scd/v1/inference.proto, microseconds) as a JSON object
// in milliseconds: the breakdown both scd-bench reports write per request.
// Thread-safety: a pure function.
#ifndef SCD_BENCH_TIMINGS_JSON_H_
#define SCD_BENCH_TIMINGS_JSON_H_

#include <nlohmann/json.hpp>

#include "scd/v1/inference.pb.h"

namespace scd::bench {

inline nlohmann::json TimingsJson(const v1::Timings& t) {
  auto ms = [](uint64_t us) { return static_cast<double>(us) / 1e3; };
  return {{"queue", ms(t.queue())},
          {"prefill", ms(t.prefill())},
          {"encode", ms(t.encode())},
          {"transfer", ms(t.transfer())},
          {"rebuild", ms(t.rebuild())},
          {"patch", ms(t.patch())},
          {"last_rebuild", ms(t.last_rebuild())},
          {"first_decode", ms(t.first_decode())},
          {"ttft", ms(t.ttft())},
          {"total", ms(t.total())}};
}

}  // namespace scd::bench

#endif  // SCD_BENCH_TIMINGS_JSON_H_
