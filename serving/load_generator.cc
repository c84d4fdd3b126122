#include "serving/load_generator.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/timer.h"
#include "proto/inference_client.h"

namespace scd {

absl::StatusOr<LoadReport> RunClosedLoop(const LoadOptions& options) {
  if (options.concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrency must be at least 1, got ", options.concurrency));
  }
  absl::Mutex mu;
  LoadReport report;
  report.concurrency = options.concurrency;
  std::vector<double> latencies, ttfts;
  absl::Time last_end = absl::InfinitePast();
  const absl::Time start = absl::Now();
  const absl::Time stop_sending = start + options.duration;
  auto client = [&] {
    while (absl::Now() < stop_sending) {
      const absl::Time sent = absl::Now();
      absl::Time first_token = absl::InfiniteFuture();
      int64_t tokens = 0;
      bool finished = false;
      std::string error;
      absl::Status status = StreamGenerate(
          options.server, options.request, options.timeout, [&](const v1::GenerateEvent& event) {
            if (event.has_token() && first_token == absl::InfiniteFuture()) {
              first_token = absl::Now();
            }
            if (event.has_finished()) {
              finished = true;
              tokens += event.finished().output_tokens();
            }
            if (event.has_error() && error.empty()) {
              error = event.error().message();
            }
          });
      const absl::Time end = absl::Now();
      absl::MutexLock lock(&mu);
      last_end = std::max(last_end, end);
      if (status.ok() && finished && error.empty()) {
        ++report.requests;
        report.output_tokens += tokens;
        latencies.push_back(absl::ToDoubleSeconds(end - sent));
        if (first_token != absl::InfiniteFuture()) {
          ttfts.push_back(absl::ToDoubleSeconds(first_token - sent));
        }
      } else {
        ++report.failed;
        if (report.first_error.empty()) {
          report.first_error =
              !status.ok() ? status.ToString() : (error.empty() ? "no Finished event" : error);
        }
      }
    }
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < options.concurrency; ++i) clients.emplace_back(client);
  for (std::thread& t : clients) t.join();
  report.seconds = last_end > start ? absl::ToDoubleSeconds(last_end - start) : 0;
  report.latency_p50 = Percentile(latencies, 0.5);
  report.latency_p99 = Percentile(latencies, 0.99);
  report.ttft_p50 = Percentile(ttfts, 0.5);
  report.ttft_p99 = Percentile(ttfts, 0.99);
  return report;
}

}  // namespace scd
