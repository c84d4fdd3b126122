#include "consumer/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace scd::consumer {
namespace {

std::string Mib(int64_t bytes) {
  return absl::StrCat(static_cast<double>(bytes) / (1 << 20), " MiB");
}

}  // namespace

std::shared_ptr<Admission> Admission::Create(Options options) {
  return std::shared_ptr<Admission>(new Admission(options));
}

std::shared_ptr<Admission> Admission::Create(uint32_t capacity) {
  Options options;
  options.capacity = capacity;
  options.max_queued = 0;
  return Create(options);
}

Admission::Reservation::~Reservation() { owner_->Release(bytes_); }

bool Admission::Fits(int64_t bytes) const {
  if (active_ >= options_.capacity) return false;
  return options_.budget_bytes <= 0 || reserved_ + bytes <= options_.budget_bytes;
}

absl::StatusOr<std::unique_ptr<Admission::Reservation>> Admission::Admit(
    int64_t bytes, absl::Time deadline, Cancellation* cancellation) {
  const absl::Time arrived = absl::Now();
  bytes = std::max<int64_t>(bytes, 0);
  // A cancellation wakes the waiters (they look at it under the lock); registered before taking
  // it, since a cancellation made already runs the callback here.
  Cancellation::Registration wake;
  if (cancellation != nullptr) {
    wake = cancellation->OnCancel([this](const absl::Status&) { absl::MutexLock lock(&mu_); });
  }
  auto cancelled = [cancellation] { return cancellation != nullptr && cancellation->cancelled(); };
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the consumer is draining (shutting down)");
  if (options_.budget_bytes > 0 && bytes > options_.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request's KV cache (prompt + max_tokens) needs ", bytes, " bytes (", Mib(bytes),
        "), more than this consumer's whole KV budget of ", options_.budget_bytes, " bytes (",
        Mib(options_.budget_bytes), ", --kv-cache-mb): lower max_tokens or the prompt"));
  }
  auto admitted = [&] {
    ++active_;
    reserved_ += bytes;
    return std::unique_ptr<Reservation>(
        new Reservation(shared_from_this(), bytes, absl::Now() - arrived));
  };
  if (queue_.empty() && Fits(bytes)) return admitted();
  if (queue_.size() >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the consumer is full: ", active_, " of ", options_.capacity, " requests running, ",
        reserved_, " of ", options_.budget_bytes > 0 ? options_.budget_bytes : 0,
        " KV bytes reserved, and its queue holds ", queue_.size(), " of ", options_.max_queued,
        " waiting requests (--max-queued)"));
  }
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  queued_bytes_ += bytes;
  auto turn = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return draining_ || cancelled() || (queue_.front() == ticket && Fits(bytes));
  };
  absl::Status left;
  if (cancelled()) {
    left = absl::CancelledError("cancelled while waiting for KV memory");
  } else if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
    left = absl::DeadlineExceededError(absl::StrCat(
        "the request's deadline passed after ", absl::FormatDuration(absl::Now() - arrived),
        " waiting for KV memory (", bytes, " bytes; ", reserved_, " of ", options_.budget_bytes,
        " reserved by ", active_, " requests)"));
  } else if (!draining_ && cancelled()) {
    left = absl::CancelledError("cancelled while waiting for KV memory");
  }
  if (left.ok() && draining_) left = absl::UnavailableError("the consumer is draining (shutting down)");
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  queued_bytes_ -= bytes;
  if (!left.ok()) return left;
  return admitted();
}

void Admission::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  --active_;
  reserved_ -= bytes;
}

void Admission::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

uint32_t Admission::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

uint32_t Admission::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(queue_.size());
}

int64_t Admission::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

int64_t Admission::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

int64_t Admission::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return options_.budget_bytes > 0 ? std::max<int64_t>(0, options_.budget_bytes - reserved_) : 0;
}

bool Admission::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

}  // namespace scd::consumer
