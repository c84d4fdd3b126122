// The request parser the HTTP server and ParseHttpRequest share (Boost.Beast): its limits and
// the conversion of what it parsed into an HttpRequest. Internal to base/'s HTTP files.
// Thread-safety: free functions on the caller's objects.
#ifndef SCD_BASE_HTTP_BEAST_H_
#define SCD_BASE_HTTP_BEAST_H_

#include <boost/beast/http.hpp>
#include <string>

#include "base/http_message.h"

namespace scd::http_beast {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

void LimitParser(RequestParser& parser, const HttpLimits& limits);
// The parsed message (the parser is done with it) as an HttpRequest from `remote_addr`.
HttpRequest ToHttpRequest(RequestParser& parser, std::string remote_addr);
// The HTTP status a parse error is answered with: 431 (head too large), 413 (body too large),
// 400 (malformed).
int StatusOfParseError(const boost::beast::error_code& error);

}  // namespace scd::http_beast

#endif  // SCD_BASE_HTTP_BEAST_H_
