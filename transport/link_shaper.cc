// One thread per shaped link releases frames at their due time. The bucket is kept as the time
// at which it is next empty ("free_at"): a data frame of n bytes leaves at
// max(now - burst time, free_at) + n / rate, which is a token bucket of depth `burst_bytes` whose
// tokens may go into debt by one frame.
#include "transport/link_shaper.h"

#include <algorithm>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace scd::transport {
namespace {

class ShapedLink : public Link {
 public:
  ShapedLink(std::unique_ptr<Link> inner, LinkShape shape)
      : inner_(std::move(inner)), shape_(shape), thread_([this] { Loop(); }) {}

  ~ShapedLink() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    inner_->Close();
  }

  void Start(LinkHandler* handler) override { inner_->Start(handler); }

  absl::Status Send(Frame frame) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::FailedPreconditionError("shaped link is closed");
    const absl::Time now = absl::Now();
    absl::Time due = now;
    if (!IsControl(frame.type) && shape_.gbps > 0) {
      const double seconds_per_byte = 8.0 / (shape_.gbps * 1e9);
      const absl::Time earliest = now - absl::Seconds(shape_.burst_bytes * seconds_per_byte);
      free_at_ = std::max(free_at_, earliest) +
                 absl::Seconds(static_cast<double>(frame.wire_bytes()) * seconds_per_byte);
      due = std::max(now, free_at_);
    }
    due += shape_.latency;
    // Control frames have their own queue, so they never wait behind data frames.
    (IsControl(frame.type) ? control_ : data_).push_back({due, std::move(frame)});
    changed_ = true;
    return absl::OkStatus();
  }

  // Removes the session's queued data frames and moves every later data frame earlier by the time
  // the removed ones would have taken, as if they had never entered the bucket.
  void DropSession(uint64_t session_id) override {
    std::deque<Due> dropped;  // declared first: its payloads are released after the unlock
    absl::MutexLock lock(&mu_);
    // Nothing of the session queued: leave the queue alone (moving every frame into `kept` and
    // then not swapping it back emptied every other session's frames: issue 14's cancel storm).
    if (std::none_of(data_.begin(), data_.end(),
                     [session_id](const Due& due) { return due.frame.session_id == session_id; })) {
      return;
    }
    const double seconds_per_byte = shape_.gbps > 0 ? 8.0 / (shape_.gbps * 1e9) : 0;
    absl::Duration saved = absl::ZeroDuration();
    std::deque<Due> kept;
    for (Due& due : data_) {
      if (due.frame.session_id == session_id) {
        saved += absl::Seconds(static_cast<double>(due.frame.wire_bytes()) * seconds_per_byte);
        dropped.push_back(std::move(due));
      } else {
        due.at -= saved;
        kept.push_back(std::move(due));
      }
    }
    if (dropped.empty()) return;
    data_.swap(kept);
    free_at_ -= saved;
    changed_ = true;
  }

  void Close() override {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      data_.clear();
      control_.clear();
    }
    inner_->Close();
  }

  std::string Describe() const override {
    return absl::StrCat(inner_->Describe(), absl::StrFormat(" shaped %.3g Gbit/s +%s", shape_.gbps,
                                                            absl::FormatDuration(shape_.latency)));
  }

 private:
  struct Due {
    absl::Time at;
    Frame frame;
  };

  void Loop() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      if (stopping_) return;
      absl::Time next = absl::InfiniteFuture();
      if (!data_.empty()) next = data_.front().at;
      if (!control_.empty()) next = std::min(next, control_.front().at);
      if (next > absl::Now()) {
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || changed_; };
        changed_ = false;
        mu_.AwaitWithDeadline(absl::Condition(&wake), next);
        continue;
      }
      std::deque<Due>& queue =
          (!control_.empty() && control_.front().at <= absl::Now()) ? control_ : data_;
      Frame frame = std::move(queue.front().frame);
      queue.pop_front();
      mu_.Unlock();
      inner_->Send(std::move(frame)).IgnoreError();  // a down link reports itself to the handler
      mu_.Lock();
    }
  }

  std::unique_ptr<Link> inner_;
  const LinkShape shape_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time free_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::deque<Due> data_ ABSL_GUARDED_BY(mu_);
  std::deque<Due> control_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after every member is ready
};

}  // namespace

std::unique_ptr<Link> ShapeLink(std::unique_ptr<Link> inner, LinkShape shape) {
  if (!shape.enabled()) return inner;
  return std::make_unique<ShapedLink>(std::move(inner), shape);
}

}  // namespace scd::transport
