#include "base/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/host_port.h"
#include "base/thread_name.h"

namespace scd {
namespace {

constexpr char kJson[] = "application/json";

void Unavailable(httplib::Response& response, const std::string& status) {
  response.status = 503;
  response.set_content(OpenAiErrorJson(absl::StrCat("the server is ", status), "unavailable", 503),
                       kJson);
}

}  // namespace

std::string OpenAiErrorJson(const std::string& message, const std::string& type, int code) {
  nlohmann::json error = {{"message", message}, {"type", type}, {"param", nullptr},
                          {"code", code}};
  // Client text may be cut mid UTF-8 sequence: replaced, never a throw.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

MetricsHttpHandler::MetricsHttpHandler(MetricsRegistry* metrics,
                                       std::function<std::string()> health)
    : metrics_(metrics), health_(std::move(health)) {}

bool MetricsHttpHandler::Handle(const httplib::Request& request, httplib::Response& response) {
  if (request.method != "GET" && request.method != "HEAD") return false;
  if (request.path == "/metrics") {
    response.set_content(metrics_->Render(), "text/plain; version=0.0.4; charset=utf-8");
    return true;
  }
  if (request.path == "/health") {
    const std::string status = health_ ? health_() : "serving";
    response.status = status == "serving" ? 200 : 503;
    response.set_content(nlohmann::json{{"status", status}}.dump(), kJson);
    return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  absl::StatusOr<HostPort> where = ParseHostPort(options.listen);
  if (!where.ok()) return where.status();
  std::unique_ptr<HttpServer> http(new HttpServer());
  if (!options.tls_cert.empty()) {
    auto tls = std::make_unique<httplib::SSLServer>(
        options.tls_cert.c_str(), options.tls_key.c_str(),
        options.tls_client_ca.empty() ? nullptr : options.tls_client_ca.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HTTPS on ", options.listen, ": cannot use the certificate ", options.tls_cert,
          " with the key ", options.tls_key,
          options.tls_client_ca.empty() ? "" : absl::StrCat(" and client CA ", options.tls_client_ca)));
    }
    http->server_ = std::move(tls);
  } else {
    http->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *http->server_;
  const int threads = std::max(2, options.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(options.max_body_bytes);
  server.set_read_timeout(options.read_timeout_seconds, 0);
  HttpServer* self = http.get();
  const auto dispatch = [self](const httplib::Request& request, httplib::Response& response) {
    self->Dispatch(request, response);
  };
  // Every path and method goes to the node's handler (set later, swapped under a lock).
  server.Get(".*", dispatch);
  server.Post(".*", dispatch);
  server.Put(".*", dispatch);
  server.Delete(".*", dispatch);
  server.Patch(".*", dispatch);
  server.Options(".*", dispatch);
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        response.status = 500;
        response.set_content(OpenAiErrorJson("internal error", "internal_error", 500), kJson);
      });
  // httplib answers some errors itself (413 for a body over the limit, 400 for a malformed
  // request) with no body: give them OpenAI's error shape.
  const size_t max_body = options.max_body_bytes;
  server.set_error_handler([max_body](const httplib::Request&, httplib::Response& response) {
    if (!response.body.empty()) return;
    const std::string message =
        response.status == 413
            ? absl::StrCat("the request body is too large (limit ", max_body, " bytes)")
            : absl::StrCat("HTTP ", response.status);
    response.set_content(OpenAiErrorJson(message, "invalid_request_error", response.status),
                         kJson);
  });
  const std::string host = where->host.empty() ? "0.0.0.0" : where->host;
  int port = where->port;
  if (port == 0) {
    port = server.bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!server.bind_to_port(host, port)) {
    port = 0;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options.listen,
                     " (address in use or not this machine's)"));
  }
  http->address_ = HostPort{where->host, static_cast<uint16_t>(port)}.ToString();
  http->thread_ = std::thread([self] {
    NameThisThread("scd-http");
    self->server_->listen_after_bind();
  });
  return http;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::SetHandler(std::shared_ptr<HttpHandler> handler) {
  absl::MutexLock lock(&mu_);
  handler_ = std::move(handler);
}

void HttpServer::SetDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Dispatch(const httplib::Request& request, httplib::Response& response) {
  std::shared_ptr<HttpHandler> handler;
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    handler = handler_;
    draining = draining_;
  }
  if (request.path == "/health" && (draining || handler == nullptr)) {
    response.status = 503;
    response.set_content(
        nlohmann::json{{"status", draining ? "draining" : "loading"}}.dump(), kJson);
    return;
  }
  if (handler == nullptr) return Unavailable(response, "loading");
  if (handler->Handle(request, response)) return;
  response.status = 404;
  response.set_content(
      OpenAiErrorJson(absl::StrCat("no such endpoint: ", request.method, " ", request.path),
                      "invalid_request_error", 404),
      kJson);
}

}  // namespace scd
