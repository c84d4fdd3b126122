// One thread per shaped link releases frames at their due time; a frame due at once with nothing
// queued or being sent goes out on the sender's own thread instead (a hand-off to the shaper's
// thread waits for a scheduler slice when the sender's CPU is busy computing: measured, a
// producer's last layer left up to 0.8 ms late behind its own prefill). The bucket is kept as the
// time at which it is next empty ("free_at"): a data frame of n bytes leaves at max(now - burst
// time, free_at) + n / rate, which is a token bucket of depth `burst_bytes` whose tokens may go
// into debt by one frame. Frames wait in a LaneQueue: control frames skip the bucket and never wait
// behind data. A new rate (Reshape) stretches or shrinks what is left of the bucket's schedule by
// old rate / new rate from that instant: the bytes not yet released go at the new rate, as on a
// real link whose rate drops under a transfer.
#include "transport/link_shaper.h"

#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "transport/lane_queue.h"
#include "transport/link_wrapper.h"

namespace scd::transport {
namespace {

class ShapedLink : public LinkWrapper {
 public:
  ShapedLink(std::unique_ptr<Link> inner, LinkShape shape)
      : LinkWrapper(std::move(inner)), shape_(shape), thread_([this] { Loop(); }) {}

  ~ShapedLink() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    inner().Close();
  }

  absl::Status Send(Frame frame) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return absl::FailedPreconditionError("shaped link is closed");
      const absl::Time now = absl::Now();
      absl::Time due = now;
      if (!IsControl(frame.type) && shape_.gbps > 0) {
        const absl::Time earliest = now - ByteTime(shape_.burst_bytes);
        free_at_ = std::max(free_at_, earliest) + ByteTime(frame.wire_bytes());
        due = std::max(now, free_at_);
      }
      const absl::Time at = due + shape_.latency;
      if (at > now || sending_ || !queue_.data().empty() || !queue_.control().empty()) {
        queue_.Push({at, due, std::move(frame)});
        changed_ = true;
        return absl::OkStatus();
      }
      sending_ = true;  // due now and nothing ahead of it: sent here, in order
    }
    absl::Status sent = inner().Send(std::move(frame));
    absl::MutexLock lock(&mu_);
    sending_ = false;  // the shaper's thread waits on it, if anything was queued meanwhile
    return sent;
  }

  // Removes the session's queued data frames and moves every later data frame earlier by the time
  // the removed ones would have taken, as if they had never entered the bucket; then lets the
  // backend drop what it still holds of the session.
  void DropSession(uint64_t session_id) override {
    std::deque<Due> dropped;  // released after the unlock
    {
      absl::MutexLock lock(&mu_);
      size_t bytes = 0;
      dropped = queue_.DropSession(
          session_id, [](const Due&) { return false; },
          [this](Due& kept, size_t dropped_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            kept.at -= ByteTime(dropped_bytes);
            kept.left_bucket -= ByteTime(dropped_bytes);
          },
          &bytes);
      if (!dropped.empty()) {
        free_at_ -= ByteTime(bytes);
        changed_ = true;
      }
    }
    LinkWrapper::DropSession(session_id);
  }

  absl::Status Reshape(const LinkShape& shape) override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    // Each byte's time at the new rate against the old (0: to unlimited; from unlimited nothing
    // waits in the bucket).
    const double stretch = shape.gbps <= 0 ? 0 : shape_.gbps <= 0 ? 1 : shape_.gbps / shape.gbps;
    auto retime = [&](absl::Time t) { return t > now ? now + (t - now) * stretch : t; };
    for (Due& due : queue_.data()) {
      const absl::Time left = retime(due.left_bucket);
      due.at += left - due.left_bucket;  // the latency it was queued with stays
      due.left_bucket = left;
    }
    free_at_ = retime(free_at_);
    shape_ = shape;
    changed_ = true;
    return absl::OkStatus();
  }

  void Close() override {
    std::deque<Due> queued;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      queued = queue_.TakeAll();
    }
    LinkWrapper::Close();
  }

  std::string Describe() const override {
    absl::MutexLock lock(&mu_);
    return absl::StrCat(LinkWrapper::Describe(),
                        absl::StrFormat(" shaped %.3g Gbit/s +%s", shape_.gbps,
                                        absl::FormatDuration(shape_.latency)));
  }

 private:
  struct Due {
    absl::Time at;           // delivered to the inner link
    absl::Time left_bucket;  // through the bucket (at less the latency)
    Frame frame;
  };

  // How long `bytes` take at the shaped rate (zero when the rate is unlimited).
  absl::Duration ByteTime(size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shape_.gbps <= 0) return absl::ZeroDuration();
    return absl::Seconds(static_cast<double>(bytes) * 8.0 / (shape_.gbps * 1e9));
  }

  void Loop() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      if (stopping_) return;
      if (sending_) {  // a sender's own thread is sending: what is due goes after it
        auto sent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !sending_; };
        mu_.Await(absl::Condition(&sent));
        continue;
      }
      absl::Time next = absl::InfiniteFuture();
      if (!queue_.data().empty()) next = queue_.data().front().at;
      if (!queue_.control().empty()) next = std::min(next, queue_.control().front().at);
      const absl::Time now = absl::Now();
      if (next > now) {
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || changed_; };
        changed_ = false;
        mu_.AwaitWithDeadline(absl::Condition(&wake), next);
        continue;
      }
      // The control lane's front when due (it may have a later due time than the data front only
      // through the latency both share), else the data front.
      std::deque<Due>& lane = (!queue_.control().empty() && queue_.control().front().at <= now)
                                  ? queue_.control()
                                  : queue_.data();
      Frame frame = std::move(lane.front().frame);
      lane.pop_front();
      sending_ = true;
      mu_.Unlock();
      inner().Send(std::move(frame)).IgnoreError();  // a down link reports itself to the handler
      mu_.Lock();
      sending_ = false;
    }
  }

  mutable absl::Mutex mu_;
  LinkShape shape_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  // A frame is being handed to the inner link, by the shaper's thread or a sender's own: the
  // next waits, so frames reach the inner link in the order they left the bucket.
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time free_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  LaneQueue<Due> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after every member is ready
};

}  // namespace

std::unique_ptr<Link> ShapeLink(std::unique_ptr<Link> inner, LinkShape shape) {
  if (!shape.enabled() && !shape.reshapable) return inner;
  return std::make_unique<ShapedLink>(std::move(inner), shape);
}

}  // namespace scd::transport
