#include "base/exception_guard.h"

#include "absl/strings/str_cat.h"

namespace scd {

absl::Status StatusFromException(absl::string_view where, const std::exception& e) {
  absl::string_view what = e.what();
  // c10::Error appends "\nException raised from ..." and a stack trace: useful in a debugger,
  // noise in a one-line error.
  if (size_t cut = what.find("\nException raised from"); cut != absl::string_view::npos) {
    what = what.substr(0, cut);
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(where, ": out of memory: ", what));
  }
  return absl::InternalError(absl::StrCat(where, ": ", what));
}

absl::Status StatusFromUnknownException(absl::string_view where) {
  return absl::InternalError(absl::StrCat(where, ": unknown exception"));
}

}  // namespace scd
