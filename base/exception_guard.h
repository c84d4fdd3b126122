// GuardExceptions: the one place where exceptions become absl::Status. libtorch reports misuse,
// shape errors and allocation failures by throwing (c10::Error is a std::exception); a public
// entry point of model/ or codec/ that calls libtorch runs its body through GuardExceptions so
// that nothing thrown escapes a module boundary, and a daemon never dies of one.
// Torch-free: it only needs std::exception.
// Thread-safety: stateless.
#ifndef SCD_BASE_EXCEPTION_GUARD_H_
#define SCD_BASE_EXCEPTION_GUARD_H_

#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace scd {

// The status for a caught exception: ResourceExhausted for std::bad_alloc, Internal otherwise;
// the message names `where` and the exception's text without libtorch's C++ backtrace.
absl::Status StatusFromException(absl::string_view where, const std::exception& e);
absl::Status StatusFromUnknownException(absl::string_view where);

// Runs `body` (returning absl::Status or absl::StatusOr<T>) and converts anything it throws.
template <typename Body>
auto GuardExceptions(absl::string_view where, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return StatusFromException(where, e);
  } catch (...) {
    return StatusFromUnknownException(where);
  }
}

}  // namespace scd

#endif  // SCD_BASE_EXCEPTION_GUARD_H_
