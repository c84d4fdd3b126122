#include "bench/soak_load.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/progress.h"

namespace scd::bench {

void SoakWarmUp(const SoakDeployment& d, const std::vector<std::string>& targets,
                const SoakChecks& checks, int per_coordinator) {
  SoakCanceller canceller;
  const std::vector<std::string> coordinators = d.LiveCoordinators();
  WorkQueue workers(per_coordinator * static_cast<int>(coordinators.size()));
  static const char* kModes[] = {"local", "raw", "scd", "auto"};
  int64_t index = 0;
  for (const std::string& c : coordinators) {
    for (int i = 0; i < per_coordinator; ++i, ++index) {
      SoakRequestSpec spec;
      spec.index = -1 - index;
      spec.request_id = absl::StrCat("warm-up-", index);
      spec.prompt = static_cast<int>(index % static_cast<int64_t>(checks.prompts->size()));
      spec.targets =
          i % 5 == 4 ? targets
                     : std::vector<std::string>{targets[static_cast<size_t>(i) % targets.size()]};
      spec.mode = kModes[i % 4];
      spec.max_tokens = 16;
      spec.deadline_ms = 20000;
      workers.Run([spec, c, &checks, &canceller] {
        RunSoakRequest(spec, *checks.prompts, c, *checks.references, checks.tie, canceller);
      });
    }
  }
}  // the queue's destructor waits for every request

SoakLoad::SoakLoad(const SoakDeployment& d, const SoakMix& mix, const SoakChecks& checks,
                   double rate, int workers, uint64_t seed)
    : d_(d),
      mix_(mix),
      checks_(checks),
      rate_(rate),
      seed_(seed),
      workers_(std::make_unique<WorkQueue>(workers)) {}

SoakLoad::~SoakLoad() {
  if (thread_.joinable()) thread_.join();
}

void SoakLoad::Start(absl::Time end) {
  thread_ = std::thread([this, end] { Arrivals(end); });
}

std::vector<SoakRecord> SoakLoad::Finish() {
  thread_.join();
  workers_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(records_);
}

void SoakLoad::Arrivals(absl::Time end) {
  std::mt19937_64 rng(seed_);
  std::exponential_distribution<double> gap(rate_);
  absl::Time next = absl::Now();
  for (int64_t i = 0;; ++i) {
    next += absl::Seconds(gap(rng));
    if (next >= end) break;
    absl::SleepFor(next - absl::Now());
    const std::vector<std::string> live = d_.LiveCoordinators();
    const std::string coordinator =
        live.empty() ? std::string() : live[static_cast<size_t>(i) % live.size()];
    SoakRequestSpec spec =
        DrawSoakRequest(mix_, static_cast<int>(checks_.prompts->size()), seed_, i);
    ++sent_;
    workers_->Run([this, spec = std::move(spec), coordinator] {
      SoakRecord r = Run(spec, coordinator);
      bool bad = !r.violations.empty();
      for (const SoakStream& s : r.streams) bad = bad || !s.finished;
      if (bad && !r.client_ended) ++not_ok_;
      ++completed_;
      std::lock_guard<std::mutex> lock(mu_);
      records_.push_back(std::move(r));
    });
  }
}

SoakRecord SoakLoad::Run(const SoakRequestSpec& spec, const std::string& coordinator) {
  if (!coordinator.empty()) {
    return RunSoakRequest(spec, *checks_.prompts, coordinator, *checks_.references, checks_.tie,
                          canceller_, [this] { return d_.LiveCoordinators(); });
  }
  SoakRecord r;  // every coordinator down or frozen: the client could not send it
  r.spec = spec;
  r.sent = r.ended = absl::Now();
  r.rpc_code = static_cast<int>(absl::StatusCode::kUnavailable);
  r.rpc_error = "no live coordinator";
  for (const std::string& t : spec.targets) {
    SoakStream& s = r.streams.emplace_back();
    s.target = t;
    s.code = r.rpc_code;
    s.error = r.rpc_error;
  }
  return r;
}

SoakSampler::SoakSampler(const SoakDeployment& d, const SoakLoad& load, absl::Duration duration,
                         bool progress)
    : d_(d),
      load_(load),
      duration_(duration),
      progress_(progress),
      points_(static_cast<size_t>(d.size())) {}

void SoakSampler::Start(absl::Time start) {
  thread_ = std::thread([this, start] { Loop(start); });
}

void SoakSampler::SetFault(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  fault_ = std::move(what);
}

std::vector<std::vector<RssPoint>> SoakSampler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  thread_.join();
  return std::move(points_);
}

void SoakSampler::Loop(absl::Time start) {
  const int64_t total = absl::ToInt64Seconds(duration_);
  Progress bar("soak", total, progress_);
  int64_t shown = 0;
  absl::Time next_sample = absl::Now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
      bar.SetDetail(absl::StrCat(load_.sent(), " sent, ", load_.completed(), " ended, ",
                                 load_.not_ok(), " not ok", fault_.empty() ? "" : "; ", fault_));
    }
    const int64_t elapsed = std::min(total, absl::ToInt64Seconds(absl::Now() - start));
    if (elapsed > shown) bar.Advance(elapsed - shown);
    shown = std::max(shown, elapsed);
    if (absl::Now() >= next_sample) {
      next_sample += absl::Seconds(2);
      for (int i = 0; i < d_.size(); ++i) {
        const ProcSample s = d_.Sample(i);
        if (s.ok) {
          points_[static_cast<size_t>(i)].push_back({d_.Node(i).generation, absl::Now(),
                                                     s.rss_bytes, load_.completed(),
                                                     s.rss_anon_bytes});
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  bar.Done();
}

}  // namespace scd::bench
