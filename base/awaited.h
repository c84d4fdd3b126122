// Awaited<T>: a value that a callback delivers (on any thread) and another thread waits for --
// how a blocking call is made of an asynchronous one (Admission::Admit of AdmitAsync; a test
// waiting for StartTarget's end). The callback holds a share of the state, so neither side frees
// it while the other still uses it (a notification on the waiter's stack may be gone while Notify
// returns).
//
//   Awaited<absl::Status> ended;
//   StartSomething(ended.Setter());
//   absl::Status status = ended.Wait();
//
// Thread-safety: the setter may run on any thread, once; Wait on one thread, once.
#ifndef SCD_BASE_AWAITED_H_
#define SCD_BASE_AWAITED_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {

template <typename T>
class Awaited {
 public:
  // The callback that delivers the value.
  std::function<void(T)> Setter() const {
    return [state = state_](T value) {
      absl::MutexLock lock(&state->mu);
      state->value = std::move(value);
    };
  }
  // Waits until the value is delivered; returns it.
  T Wait() {
    State& state = *state_;
    absl::MutexLock lock(&state.mu);
    auto delivered = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
      return state.value.has_value();
    };
    state.mu.Await(absl::Condition(&delivered));
    return *std::move(state.value);
  }

 private:
  struct State {
    absl::Mutex mu;
    std::optional<T> value ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace scd

#endif  // SCD_BASE_AWAITED_H_
