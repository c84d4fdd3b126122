// HttpServer: a daemon's HTTP listener (Boost.Beast on Asio): /health and /metrics on every
// daemon, the OpenAI-compatible API on the coordinator and the all-in-one server. It binds
// `listen` at once (port 0: a free port), before the node behind it has loaded, and answers
// /health with 503 {"status":"loading"} (every other path 503 in OpenAI's error shape) until
// SetHandler installs what the node serves; SetDraining turns /health to 503 "draining" for the
// drain. /readyz is /health under the name Kubernetes' probes use; /livez answers 200
// {"status":"alive"} in every phase (the process answers). Every connection is a state object on a
// few I/O threads (`io_threads`): nothing holds a thread while it waits, a streamed answer
// included, so the threads do not grow with the connections. Handlers run on those threads and must
// not block: one that waits answers later through its HttpReply (base/http_message.h), from any
// thread. Limits, each answered in OpenAI's error shape where an answer can still be sent: a
// request head over max_header_bytes 431, a body over max_body_bytes 413, a malformed request 400;
// a request not read in full within read_timeout_seconds (also the idle time allowed between a
// kept-alive connection's requests) is dropped; connections past max_connections get 503 and
// are closed; a reader that takes nothing of a write for write_timeout_seconds, or lets more than
// max_queued_bytes pile up, is dropped (the handler hears OnClosed). A client that disconnects
// while its answer is pending is noticed (OnClosed). A handler that throws answers 500; no
// exception escapes.
// Thread-safety: thread-safe.
#ifndef SCD_BASE_HTTP_SERVER_H_
#define SCD_BASE_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/http_message.h"
#include "base/metrics.h"

namespace scd {

// What answers a node's HTTP requests (the node's endpoints).
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Takes the request and returns true: it answers through `reply`, now or later, without
  // blocking this thread. False: not a path it serves (the server answers 404).
  virtual bool Handle(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) = 0;
};

// GET /metrics (the registry's text exposition) and GET /health (200 {"status":"serving"} or
// 503 with the status `health` returns, e.g. "draining").
class MetricsHttpHandler : public HttpHandler {
 public:
  // REQUIRES: `metrics` outlives the handler. `health`: "serving" or why not; null: "serving".
  MetricsHttpHandler(MetricsRegistry* metrics, std::function<std::string()> health = nullptr);
  bool Handle(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) override;

 private:
  MetricsRegistry* const metrics_;
  const std::function<std::string()> health_;
};

struct HttpServerOptions {
  std::string listen;          // HOST:PORT
  int io_threads = 2;          // the threads every connection is served on
  int max_connections = 4096;  // open at once (the process's open-file limit allows it)
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 8u << 20;    // larger bodies: 413
  int read_timeout_seconds = 30;       // a request must arrive in full within this
  int write_timeout_seconds = 30;      // a client that takes none of a write this long is dropped
  size_t max_queued_bytes = 4u << 20;  // a stream's bytes the client has not taken, at most
  // HTTPS: this certificate chain and key (PEM paths; "" = plain HTTP); with `tls_client_ca`,
  // clients must present a certificate it signed (mutual TLS).
  std::string tls_cert, tls_key, tls_client_ca;
};

class HttpServer {
 public:
  // UNAVAILABLE naming the address when it cannot listen there; INVALID_ARGUMENT for a bad
  // address or TLS files that do not load.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  const std::string& address() const;  // HOST:PORT as bound
  void SetHandler(std::shared_ptr<HttpHandler> handler);
  // /health answers 503 {"status":"draining"} from now on; other paths are still served.
  void SetDraining();
  // Connections open now (a test's and a gauge's view).
  int connections() const;
  // Stops listening, closes every connection (pending answers hear OnClosed) and joins the
  // I/O threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the open connections
};

}  // namespace scd

#endif  // SCD_BASE_HTTP_SERVER_H_
