#include "consumer/admission.h"

#include "absl/strings/str_cat.h"

namespace scd::consumer {

std::shared_ptr<Admission> Admission::Create(uint32_t capacity) {
  return std::shared_ptr<Admission>(new Admission(capacity));
}

Admission::Slot::~Slot() { owner_->Release(); }

absl::StatusOr<std::unique_ptr<Admission::Slot>> Admission::Admit() {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the consumer is draining (shutting down)");
  if (active_ >= capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the consumer is full: ", active_, " of ", capacity_, " requests running"));
  }
  ++active_;
  return std::unique_ptr<Slot>(new Slot(shared_from_this()));
}

void Admission::Release() {
  absl::MutexLock lock(&mu_);
  --active_;
}

void Admission::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

uint32_t Admission::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

bool Admission::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

}  // namespace scd::consumer
