// HttpServer: a daemon's HTTP listener (Debian's cpp-httplib): /health and /metrics on every
// daemon, the OpenAI-compatible API on the coordinator and the all-in-one server. It binds
// `listen` at once (port 0: a free port), before the node behind it has loaded, and answers
// /health with 503 {"status":"loading"} (every other path 503 in OpenAI's error shape) until
// SetHandler installs what the node serves; SetDraining turns /health to 503 "draining" for the
// drain. Request bodies past max_body_bytes get 413; a handler that throws gets 500; no exception
// escapes. Each connection is served on one of `threads` threads (a streaming response holds its
// thread until it ends): at most `threads` connections are served at once, later ones wait.
// Thread-safety: thread-safe; handlers run on the server's threads, concurrently.
#ifndef SCD_BASE_HTTP_SERVER_H_
#define SCD_BASE_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace scd {

// What answers a node's HTTP requests (the node's endpoints).
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Answers the request into `response` and returns true, or returns false for a path it does
  // not serve (the server answers 404, or 405 for a known path with another method).
  virtual bool Handle(const httplib::Request& request, httplib::Response& response) = 0;
};

// GET /metrics (the registry's text exposition) and GET /health (200 {"status":"serving"} or
// 503 with the status `health` returns, e.g. "draining").
class MetricsHttpHandler : public HttpHandler {
 public:
  // REQUIRES: `metrics` outlives the handler. `health`: "serving" or why not; null: "serving".
  MetricsHttpHandler(MetricsRegistry* metrics, std::function<std::string()> health = nullptr);
  bool Handle(const httplib::Request& request, httplib::Response& response) override;

 private:
  MetricsRegistry* const metrics_;
  const std::function<std::string()> health_;
};

struct HttpServerOptions {
  std::string listen;                        // HOST:PORT
  int threads = 64;                          // connections served at once
  size_t max_body_bytes = 8u << 20;          // larger bodies: 413
  int read_timeout_seconds = 30;             // a client silent this long mid-request is dropped
  // HTTPS: this certificate chain and key (PEM paths; "" = plain HTTP); with `tls_client_ca`,
  // clients must present a certificate it signed (mutual TLS).
  std::string tls_cert, tls_key, tls_client_ca;
};

class HttpServer {
 public:
  // UNAVAILABLE naming the address when it cannot listen there; INVALID_ARGUMENT for a bad one.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  const std::string& address() const { return address_; }  // HOST:PORT as bound
  void SetHandler(std::shared_ptr<HttpHandler> handler);
  // /health answers 503 {"status":"draining"} from now on; other paths are still served.
  void SetDraining();
  // Stops listening and waits for the connections being served. Idempotent.
  void Stop();

 private:
  HttpServer() = default;
  void Dispatch(const httplib::Request& request, httplib::Response& response);

  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  std::thread thread_;
  absl::Mutex mu_;
  std::shared_ptr<HttpHandler> handler_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

// A JSON error body in OpenAI's shape: {"error":{"message":..,"type":..,"code":..}}.
std::string OpenAiErrorJson(const std::string& message, const std::string& type, int code);

}  // namespace scd

#endif  // SCD_BASE_HTTP_SERVER_H_
