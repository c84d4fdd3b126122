#include "consumer/admission.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/awaited.h"
#include "base/change_notice.h"
#include "base/release_clock.h"

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

Admission::Admission(Options options) : options_(options) {}

Admission::~Admission() {
  std::vector<Outcome> ended;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    while (!queue_.empty()) {
      Dequeue(queue_.front(), absl::UnavailableError("the consumer is shutting down"), &ended);
    }
  }
  Tell(std::move(ended));  // cancels their timers (one running is waited for, unless it is ours)
}

Admission::Reservation::~Reservation() { owner_->Release(bytes_); }

bool Admission::Fits(int64_t bytes) const {
  if (active_ >= options_.capacity) return false;
  return options_.budget_bytes <= 0 || reserved_ + bytes <= options_.budget_bytes;
}

std::unique_ptr<Admission::Reservation> Admission::Reserve(int64_t bytes, absl::Time arrived) {
  ++active_;
  reserved_ += bytes;
  NoteChange();
  return std::unique_ptr<Reservation>(
      new Reservation(shared_from_this(), bytes, options_.clock->Now() - arrived));
}

void Admission::Dequeue(std::shared_ptr<Waiter> waiter, Admitted result,
                        std::vector<Outcome>* ended) {
  queue_.erase(std::find(queue_.begin(), queue_.end(), waiter));
  queued_bytes_ -= waiter->bytes;
  NoteChange();
  ended->push_back(Outcome{std::move(waiter), std::move(result)});
}

void Admission::AdmitHead(std::vector<Outcome>* ended) {
  while (!queue_.empty() && !draining_ && Fits(queue_.front()->bytes)) {
    const std::shared_ptr<Waiter> head = queue_.front();
    Dequeue(head, Reserve(head->bytes, head->arrived), ended);
  }
}

void Admission::Tell(std::vector<Outcome> ended) {
  for (Outcome& o : ended) {
    o.waiter->wake.Reset();  // no lock held: a cancel callback under way may finish
    o.waiter->expiry.Reset();
    o.waiter->done(std::move(o.result));
  }
}

void Admission::AdmitAsync(int64_t bytes, absl::Time deadline, Cancellation* cancellation,
                           std::function<void(Admitted)> done, IfFull if_full) {
  const absl::Time arrived = options_.clock->Now();
  bytes = std::max<int64_t>(bytes, 0);
  auto waiter = std::make_shared<Waiter>();
  {
    absl::MutexLock lock(&mu_);
    waiter->ticket = next_ticket_++;
  }
  // Registered before the waiter can be seen in the queue (whoever ends its wait resets it), and
  // without the lock: a cancellation made already runs the callback here (finding no waiter; the
  // check below refuses it).
  if (cancellation != nullptr) {
    waiter->wake = cancellation->OnCancel([this, ticket = waiter->ticket](const absl::Status&) {
      Leave(ticket, [](const Waiter&) {
        return absl::CancelledError("cancelled while waiting for KV memory");
      });
    });
  }
  std::optional<Admitted> at_once;  // told without the lock (`done` may release a reservation)
  {
    absl::MutexLock lock(&mu_);
    if (draining_ || stopping_) {
      at_once = absl::UnavailableError("the consumer is draining (shutting down)");
    } else if (options_.budget_bytes > 0 && bytes > options_.budget_bytes) {
      at_once = absl::ResourceExhaustedError(absl::StrCat(
          "the request's KV cache (prompt + max_tokens) needs ", bytes, " bytes (", Mib(bytes),
          "), more than this consumer's whole KV budget of ", options_.budget_bytes, " bytes (",
          Mib(options_.budget_bytes), ", --kv-cache-mb): lower max_tokens or the prompt"));
    } else if (queue_.empty() && Fits(bytes)) {
      at_once = Reserve(bytes, arrived);
    } else if (cancellation != nullptr && cancellation->cancelled()) {
      at_once = absl::CancelledError("cancelled while waiting for KV memory");
    } else if (queue_.size() >= options_.max_queued) {
      at_once = absl::ResourceExhaustedError(absl::StrCat(
          "the consumer is full: ", active_, " of ", options_.capacity, " requests running, ",
          reserved_, " of ", options_.budget_bytes > 0 ? options_.budget_bytes : 0,
          " KV bytes reserved, and its queue holds ", queue_.size(), " of ", options_.max_queued,
          " waiting requests (--max-queued)"));
    } else if (if_full == IfFull::kRefuse) {
      at_once = absl::AbortedError(absl::StrCat("it would wait: ", active_, " of ",
                                                options_.capacity, " requests running, ", reserved_,
                                                " KV bytes reserved, ", queue_.size(), " waiting"));
    } else {
      waiter->bytes = bytes;
      waiter->arrived = arrived;
      waiter->deadline = deadline;
      waiter->done = std::move(done);
      queue_.push_back(waiter);
      queued_bytes_ += bytes;
      most_queued_ = std::max(most_queued_, static_cast<uint32_t>(queue_.size()));
      NoteChange();
      if (deadline < absl::InfiniteFuture()) {
        // Set under the lock, before anyone can dequeue the waiter and reset its timer. The
        // timer holds no share of the Admission (Expire takes one): the destructor ends every
        // wait, cancelling its timer.
        waiter->expiry = Clock::Timer(options_.clock, deadline,
                                      [this, ticket = waiter->ticket] { Expire(ticket); });
      }
    }
  }
  if (at_once.has_value()) {
    waiter->wake.Reset();
    done(*std::move(at_once));
  }
}

Admission::Admitted Admission::Admit(int64_t bytes, absl::Time deadline,
                                     Cancellation* cancellation) {
  Awaited<Admitted> admitted;
  AdmitAsync(bytes, deadline, cancellation, admitted.Setter());
  return admitted.Wait();
}

void Admission::Leave(uint64_t ticket, const std::function<absl::Status(const Waiter&)>& why) {
  std::vector<Outcome> ended;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [ticket](const auto& w) { return w->ticket == ticket; });
    if (it == queue_.end()) return;  // admitted or gone already
    const std::shared_ptr<Waiter> w = *it;
    Dequeue(w, why(*w), &ended);
    AdmitHead(&ended);  // the head may have changed
  }
  Tell(std::move(ended));
}

void Admission::Expire(uint64_t ticket) {
  // A share for the call (AdmitHead takes more); none left means the destructor is ending every
  // wait and waits for this callback.
  const std::shared_ptr<Admission> self = weak_from_this().lock();
  if (self == nullptr) return;
  Leave(ticket, [this](const Waiter& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::DeadlineExceededError(
        absl::StrCat("the request's deadline passed after ",
                     absl::FormatDuration(options_.clock->Now() - w.arrived),
                     " waiting for KV memory (", w.bytes, " bytes; ", reserved_, " of ",
                     options_.budget_bytes, " reserved by ", active_, " requests)"));
  });
}

void Admission::Release(int64_t bytes) {
  std::vector<Outcome> ended;
  {
    absl::MutexLock lock(&mu_);
    --active_;
    reserved_ -= bytes;
    NoteRelease();
    AdmitHead(&ended);
  }
  Tell(std::move(ended));
}

void Admission::Drain() {
  std::vector<Outcome> ended;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    while (!queue_.empty()) {
      Dequeue(queue_.front(), absl::UnavailableError("the consumer is draining (shutting down)"),
              &ended);
    }
  }
  Tell(std::move(ended));
}

bool Admission::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  return options_.clock->AwaitWithDeadline(&mu_, absl::Condition(&idle), deadline);
}

uint32_t Admission::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

uint32_t Admission::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(queue_.size());
}

uint32_t Admission::most_queued() const {
  absl::MutexLock lock(&mu_);
  return most_queued_;
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
