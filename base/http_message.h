// What an HTTP handler sees and answers through (base/http_server.h serves them): a parsed
// request (HttpRequest), a whole answer (HttpResponse), and the exchange a handler answers
// through, now or later, whole or streamed (HttpReply), and the request parser with its limits
// (ParseHttpRequest: the server's own parser over a byte string, for tests and the fuzz target).
// Thread-safety: HttpRequest and HttpResponse are values; HttpReply is thread-safe.
#ifndef SCD_BASE_HTTP_MESSAGE_H_
#define SCD_BASE_HTTP_MESSAGE_H_

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string path;                                          // the target without its query
  std::string query;                                         // after '?', or ""
  std::vector<std::pair<std::string, std::string>> headers;  // as sent, in order
  std::string body;
  std::string remote_addr;  // the client's IP address
  bool keep_alive = true;   // the connection stays open after the answer

  // The first header of that name (case-insensitive), or "".
  std::string Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // besides the framing ones

  static HttpResponse Json(int status, std::string body);
};

// One request's answer. A handler answers once: Send (whole), or StartStream, Write..., End
// (a chunked body). Calls after the answer ended, or once the exchange closed, do nothing.
class HttpReply {
 public:
  virtual ~HttpReply() = default;
  virtual void Send(HttpResponse response) = 0;
  // Sends `head`'s status and headers (its body is ignored); the body follows in Writes.
  virtual void StartStream(HttpResponse head) = 0;
  // Queues bytes of the body. True while what is queued and not yet taken by the client is
  // under the low mark (write on); false: wait for OnRoom. True once closed (nothing to wait for).
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;
  // Calls `room` once: when the queue falls under the low mark or the exchange closes (at once,
  // on this thread, if either already holds; on a close, after OnClosed's callback). One
  // callback at a time. A writer that loops while Write returns true also checks OnClosed.
  virtual void OnRoom(std::function<void()> room) = 0;
  // Calls `closed` once if the exchange closes before its answer was sent in full: the client
  // went away or read too slowly, or the server stopped (at once if it already has). Never
  // called for an exchange that completed.
  virtual void OnClosed(std::function<void()> closed) = 0;
};

// What the parser accepts (larger: 431 for the head, 413 for the body).
struct HttpLimits {
  size_t max_header_bytes = 16 << 10;  // request line and headers
  size_t max_body_bytes = 8u << 20;
};

// One HTTP/1.x request from `bytes` by the server's own parser and limits: INVALID_ARGUMENT
// for a malformed or incomplete request, RESOURCE_EXHAUSTED for one over a limit (the message
// says which).
absl::StatusOr<HttpRequest> ParseHttpRequest(std::string_view bytes, const HttpLimits& limits);

// A JSON error body in OpenAI's shape: {"error":{"message":..,"type":..,"code":..}}.
std::string OpenAiErrorJson(const std::string& message, const std::string& type, int code);

}  // namespace scd

#endif  // SCD_BASE_HTTP_MESSAGE_H_
