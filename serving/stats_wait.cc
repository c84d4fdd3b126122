#include "serving/stats_wait.h"

#include <algorithm>
#include <atomic>

#include "absl/time/clock.h"
#include "base/change_notice.h"

namespace scd {
namespace {

constexpr absl::Duration kMaxWait = absl::Seconds(10);
constexpr int kMaxWaiters = 16;

std::atomic<int> waiting{0};

}  // namespace

uint64_t AwaitStatsChange(const v1::StatsRequest& request, const grpc::ServerContext& context) {
  if (request.wait_ms() == 0 || ChangeCount() > request.after_change()) return ChangeCount();
  if (waiting.fetch_add(1) >= kMaxWaiters) {
    waiting.fetch_sub(1);
    return ChangeCount();
  }
  const absl::Time now = Clock::Real()->Now();
  absl::Time deadline = now + std::min(absl::Milliseconds(request.wait_ms()), kMaxWait);
  deadline = std::min(deadline, absl::FromChrono(context.deadline()));
  const uint64_t seen = AwaitChangeAfter(request.after_change(), deadline);
  waiting.fetch_sub(1);
  return seen;
}

}  // namespace scd
