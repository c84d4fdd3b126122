// libFuzzer target: the public API's request bytes as the checked front takes them
// (serving/checked_inference.h): the UTF-8 scan over the raw message, protobuf parsing, and
// ValidateGenerateRequest. A request that passes validation must carry valid UTF-8 in every
// string field and a request_id of printable ASCII within bounds.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/log_text.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/request_validation.h"
#include "serving/checked_inference.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  google::protobuf::LogSilencer quiet;  // protobuf's parser logs bad UTF-8 it meets
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  bool malformed = false;
  const bool bad_utf8 =
      scd::FindInvalidUtf8(*scd::v1::GenerateRequest::descriptor(), bytes, &malformed)
          .has_value();
  scd::v1::GenerateRequest request;
  const bool parsed = request.ParseFromArray(data, static_cast<int>(size));
  // The scan and protobuf agree on what is a message: the checked front may refuse on the scan.
  if (malformed && parsed) std::abort();
  if (bad_utf8 || !parsed) return 0;
  if (!scd::ValidateGenerateRequest(request).ok()) return 0;
  if (!scd::IsValidUtf8(request.prompt()) || request.request_id().size() > 128 ||
      !scd::IsPrintableAscii(request.request_id())) {
    std::abort();
  }
  (void)scd::ForLog(request.prompt());
  return 0;
}
