#include "coordinator/resume_book.h"

#include "absl/strings/str_cat.h"
#include "coordinator/resume_token.h"

namespace scd::coordinator {

void ResumeBook::ForgetBefore(absl::Time now) {
  while (!expiry_.empty() &&
         (expiry_.begin()->first <= now || expiry_.size() > options_.max_tokens)) {
    used_.erase(expiry_.begin()->second);
    expiry_.erase(expiry_.begin());
  }
  for (auto it = recent_.begin(); it != recent_.end();) {
    std::deque<absl::Time>& times = it->second;
    while (!times.empty() && times.front() <= now - absl::Minutes(1)) times.pop_front();
    it = times.empty() ? recent_.erase(it) : std::next(it);
  }
}

absl::Status ResumeBook::Admit(const std::string& mac, uint64_t position, const std::string& tenant,
                               absl::Time expires, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ForgetBefore(now);
  if (used_.count({mac, position}) > 0) return absl::PermissionDeniedError(kResumeRefused);
  std::deque<absl::Time>& times = recent_[tenant];
  if (times.size() >= options_.per_tenant_per_minute) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this tenant resumed ", times.size(), " streams in the last minute (at most ",
                     options_.per_tenant_per_minute, "); try again later"));
  }
  times.push_back(now);
  used_.insert({mac, position});
  expiry_.emplace(expires, std::make_pair(mac, position));
  ForgetBefore(now);  // over max_tokens: the oldest go
  return absl::OkStatus();
}

}  // namespace scd::coordinator
