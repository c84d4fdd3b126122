// ResumeBook: the coordinator's limits on resumes (coordinator/resume_token.h), a policy of its
// state and the time it is given: a token works once per position (the count of received ids it
// came with) on this coordinator -- a replay is refused as any bad token is (PERMISSION_DENIED
// kResumeRefused) -- and a tenant (the request's cache_salt) resumes at most
// `per_tenant_per_minute` times in any minute (RESOURCE_EXHAUSTED). What it remembers of a token
// goes once the token expires; at most `max_tokens` are remembered (those expiring soonest go
// first). Thread-safety: thread-safe (one mutex).
#ifndef SCD_COORDINATOR_RESUME_BOOK_H_
#define SCD_COORDINATOR_RESUME_BOOK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace scd::coordinator {

class ResumeBook {
 public:
  struct Options {
    uint32_t per_tenant_per_minute = 60;
    size_t max_tokens = 100000;
  };
  explicit ResumeBook(Options options) : options_(options) {}

  // A resume with the token whose MAC is `mac` (expiring at `expires`) at `position`, for
  // `tenant`, at `now`: OK (counted), or the refusal above.
  absl::Status Admit(const std::string& mac, uint64_t position, const std::string& tenant,
                     absl::Time expires, absl::Time now);

 private:
  void ForgetBefore(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::set<std::pair<std::string, uint64_t>> used_ ABSL_GUARDED_BY(mu_);  // (mac, position)
  std::multimap<absl::Time, std::pair<std::string, uint64_t>> expiry_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<absl::Time>> recent_ ABSL_GUARDED_BY(mu_);  // per tenant
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_RESUME_BOOK_H_
