// A closed-loop load on the public Inference API: C clients, each sending the same request again
// as soon as its previous one finished, for a fixed time; reports output tokens/s and latency
// percentiles. What `scd-serve-bench` prints and what the serving tests assert on.
// Thread-safety: reentrant (each call has its own clients).
#ifndef SCD_SERVING_LOAD_GENERATOR_H_
#define SCD_SERVING_LOAD_GENERATOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scd/v1/inference.pb.h"

namespace scd {

struct LoadOptions {
  std::string server;           // host:port of a coordinator or an all-in-one server
  v1::GenerateRequest request;  // sent by every client (request_id left to the server)
  int concurrency = 1;          // requests in flight at once
  absl::Duration duration = absl::Seconds(5);   // clients start no request after this
  absl::Duration timeout = absl::Seconds(120);  // per request
};

struct LoadReport {
  int concurrency = 0;
  int64_t requests = 0;       // completed with a Finished event
  int64_t failed = 0;         // ended otherwise
  std::string first_error;    // of the failed ones, for the report
  int64_t output_tokens = 0;  // summed over completed requests
  double seconds = 0;         // first request sent to last one finished
  double output_tokens_per_s() const { return seconds > 0 ? output_tokens / seconds : 0; }
  double requests_per_s() const { return seconds > 0 ? requests / seconds : 0; }
  // Over completed requests, seconds: whole request, and time to the first token.
  double latency_p50 = 0, latency_p99 = 0, ttft_p50 = 0, ttft_p99 = 0;
};

// Runs the load. InvalidArgument for concurrency < 1; the report otherwise (failures counted).
absl::StatusOr<LoadReport> RunClosedLoop(const LoadOptions& options);

}  // namespace scd

#endif  // SCD_SERVING_LOAD_GENERATOR_H_
