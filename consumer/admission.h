// Admission: a consumer reserves capacity for a request before anything is sent to it (the
// producer starts streaming only to a consumer that admitted the request), and refuses early with
// RESOURCE_EXHAUSTED when it is full. A Slot releases its place when destroyed, whichever way the
// request ended.
// Thread-safety: thread-safe.
#ifndef SCD_CONSUMER_ADMISSION_H_
#define SCD_CONSUMER_ADMISSION_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace scd::consumer {

class Admission : public std::enable_shared_from_this<Admission> {
 public:
  // A place held by one request; released on destruction.
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class Admission;
    explicit Slot(std::shared_ptr<Admission> owner) : owner_(std::move(owner)) {}
    std::shared_ptr<Admission> owner_;
  };

  static std::shared_ptr<Admission> Create(uint32_t capacity);
  // A slot, or RESOURCE_EXHAUSTED naming the capacity when every slot is taken; UNAVAILABLE once
  // draining.
  absl::StatusOr<std::unique_ptr<Slot>> Admit();
  // Refuses every later Admit (SIGTERM: drain what is running, take nothing new).
  void Drain();
  uint32_t active() const;
  uint32_t capacity() const { return capacity_; }
  bool draining() const;

 private:
  explicit Admission(uint32_t capacity) : capacity_(capacity) {}
  void Release();

  const uint32_t capacity_;
  mutable absl::Mutex mu_;
  uint32_t active_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_ADMISSION_H_
