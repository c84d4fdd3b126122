#include "base/http_message.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/http_beast.h"

namespace scd {

namespace http = boost::beast::http;

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return "";
}

HttpResponse HttpResponse::Json(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

std::string OpenAiErrorJson(const std::string& message, const std::string& type, int code) {
  nlohmann::json error = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}};
  // Client text may be cut mid UTF-8 sequence: replaced, never a throw.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

namespace http_beast {

void LimitParser(RequestParser& parser, const HttpLimits& limits) {
  parser.header_limit(static_cast<uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser.body_limit(limits.max_body_bytes);
}

HttpRequest ToHttpRequest(RequestParser& parser, std::string remote_addr) {
  http::request<http::string_body> message = parser.release();
  HttpRequest request;
  const boost::beast::string_view method = message.method_string();
  request.method.assign(method.data(), method.size());
  const std::string_view target(message.target().data(), message.target().size());
  const size_t question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
  for (const auto& field : message) {
    request.headers.emplace_back(
        std::string(field.name_string().data(), field.name_string().size()),
        std::string(field.value().data(), field.value().size()));
  }
  request.keep_alive = message.keep_alive();
  request.body = std::move(message.body());
  request.remote_addr = std::move(remote_addr);
  return request;
}

int StatusOfParseError(const boost::beast::error_code& error) {
  if (error == http::error::header_limit) return 431;
  if (error == http::error::body_limit) return 413;
  return 400;
}

}  // namespace http_beast

absl::StatusOr<HttpRequest> ParseHttpRequest(std::string_view bytes, const HttpLimits& limits) {
  http_beast::RequestParser parser;
  http_beast::LimitParser(parser, limits);
  parser.eager(true);
  boost::beast::error_code error;
  size_t used = 0;
  while (!error && !parser.is_done() && used < bytes.size()) {
    used += parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), error);
  }
  if (error == http::error::need_more) {
    return absl::InvalidArgumentError("an incomplete HTTP request");
  }
  if (!error && !parser.is_done() && parser.got_some()) {
    parser.put_eof(error);  // the end of input ends the request: complete, or cut
  }
  if (error) {
    const int status = http_beast::StatusOfParseError(error);
    const std::string message = absl::StrCat("HTTP ", status, ": ", error.message());
    return status == 400 ? absl::InvalidArgumentError(message)
                         : absl::ResourceExhaustedError(message);
  }
  if (!parser.is_done()) return absl::InvalidArgumentError("an incomplete HTTP request");
  return http_beast::ToHttpRequest(parser, "");
}

}  // namespace scd
