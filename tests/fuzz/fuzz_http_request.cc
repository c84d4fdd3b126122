// libFuzzer target: request bytes as the HTTP server's parser takes them (base/http_message.h
// ParseHttpRequest: Boost.Beast's parser under the server's limits). A request it accepts keeps
// within the limits, has a method and a path that starts the target, and no header line break.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/http_message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scd::HttpLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 4096;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<scd::HttpRequest> request = scd::ParseHttpRequest(bytes, limits);
  if (!request.ok()) return 0;
  if (request->method.empty() || request->body.size() > limits.max_body_bytes) std::abort();
  size_t head = request->method.size() + request->path.size() + request->query.size();
  for (const auto& [name, value] : request->headers) {
    if (name.empty() || name.find_first_of("\r\n:") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos) {
      std::abort();
    }
    head += name.size() + value.size();
  }
  if (head > limits.max_header_bytes) std::abort();
  (void)request->Header("content-length");
  return 0;
}
