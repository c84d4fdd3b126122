#include "base/http_server.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <exception>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/host_port.h"
#include "base/http_connection.h"
#include "base/thread_name.h"

namespace scd {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using http_connection::Connection;

HttpResponse HealthJson(int status, const std::string& text) {
  return HttpResponse::Json(status, nlohmann::json{{"status", text}}.dump());
}

HttpResponse Error(int status, const std::string& message, const char* type) {
  return HttpResponse::Json(status, OpenAiErrorJson(message, type, status));
}

}  // namespace

MetricsHttpHandler::MetricsHttpHandler(MetricsRegistry* metrics,
                                       std::function<std::string()> health)
    : metrics_(metrics), health_(std::move(health)) {}

bool MetricsHttpHandler::Handle(const HttpRequest& request,
                                const std::shared_ptr<HttpReply>& reply) {
  if (request.method != "GET" && request.method != "HEAD") return false;
  if (request.path == "/metrics") {
    HttpResponse response;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    response.body = metrics_->Render();
    reply->Send(std::move(response));
    return true;
  }
  if (request.path == "/health") {
    const std::string status = health_ ? health_() : "serving";
    reply->Send(HealthJson(status == "serving" ? 200 : 503, status));
    return true;
  }
  return false;
}

// The listener and its connections (a Host the connections keep alive: it owns the I/O
// context their sockets and strands live on).
class HttpServer::Impl final : public http_connection::Host,
                               public std::enable_shared_from_this<HttpServer::Impl> {
 public:
  explicit Impl(HttpServerOptions options)
      : options_(std::move(options)),
        io_(std::max(1, options_.io_threads)),
        work_(io_.get_executor()),
        acceptor_(net::make_strand(io_)) {
    limits_.max_header_bytes = options_.max_header_bytes;
    limits_.max_body_bytes = options_.max_body_bytes;
    timeouts_.read_seconds = options_.read_timeout_seconds;
    timeouts_.write_seconds = options_.write_timeout_seconds;
    timeouts_.max_queued_bytes = options_.max_queued_bytes;
  }

  absl::Status Listen();
  void Run();
  void Stop();
  void SetHandler(std::shared_ptr<HttpHandler> handler) {
    absl::MutexLock lock(&mu_);
    handler_ = std::move(handler);
  }
  void SetDraining() {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  int connections() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(connections_.size());
  }
  const std::string& address() const { return address_; }

  const HttpLimits& limits() const override { return limits_; }
  const Timeouts& timeouts() const override { return timeouts_; }
  void Dispatch(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) override;
  void Closed(const void* connection) override {
    absl::MutexLock lock(&mu_);
    connections_.erase(connection);
  }

 private:
  absl::Status LoadTls();
  void Accept();
  void OnAccept(const boost::system::error_code& error, tcp::socket socket);

  const HttpServerOptions options_;
  HttpLimits limits_;
  Timeouts timeouts_;
  net::io_context io_;
  // Keeps the threads running (not only while some operation is under way) until Stop has
  // posted its last close: without it they could end between two of its posts, and a posted
  // close that never runs would keep its connection, and this, alive.
  net::executor_work_guard<net::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::optional<net::ssl::context> tls_;
  std::vector<std::thread> threads_;
  std::string address_;
  bool stopped_ = false;  // Stop's caller only
  absl::Mutex mu_;
  std::shared_ptr<HttpHandler> handler_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unordered_map<const void*, std::weak_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

absl::Status HttpServer::Impl::LoadTls() {
  if (options_.tls_cert.empty()) return absl::OkStatus();
  tls_.emplace(net::ssl::context::tls_server);
  boost::system::error_code error;
  tls_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                        net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                        net::ssl::context::no_tlsv1_1,
                    error);
  if (!error) tls_->use_certificate_chain_file(options_.tls_cert, error);
  if (!error) tls_->use_private_key_file(options_.tls_key, net::ssl::context::pem, error);
  if (!error && !options_.tls_client_ca.empty()) {
    tls_->load_verify_file(options_.tls_client_ca, error);
    if (!error) {
      tls_->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert, error);
    }
  }
  if (!error) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "HTTPS on ", options_.listen, ": cannot use the certificate ", options_.tls_cert,
      " with the key ", options_.tls_key,
      options_.tls_client_ca.empty() ? "" : absl::StrCat(" and client CA ", options_.tls_client_ca),
      ": ", error.message()));
}

absl::Status HttpServer::Impl::Listen() {
  absl::StatusOr<HostPort> where = ParseHostPort(options_.listen);
  if (!where.ok()) return where.status();
  if (absl::Status tls = LoadTls(); !tls.ok()) return tls;
  boost::system::error_code error;
  const net::ip::address host =
      net::ip::make_address(where->host.empty() ? "0.0.0.0" : where->host, error);
  if (!error) {
    const tcp::endpoint endpoint(host, where->port);
    acceptor_.open(endpoint.protocol(), error);
    if (!error) acceptor_.set_option(net::socket_base::reuse_address(true), error);
    if (!error) acceptor_.bind(endpoint, error);
    if (!error) acceptor_.listen(net::socket_base::max_listen_connections, error);
  }
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options_.listen, ": ", error.message()));
  }
  const uint16_t port = acceptor_.local_endpoint(error).port();
  address_ = HostPort{where->host, port}.ToString();
  return absl::OkStatus();
}

void HttpServer::Impl::Run() {
  Accept();
  for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
    threads_.emplace_back([this] {
      NameThisThread("scd-http");
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception&) {
          // A callback's exception: the connection it came from is dropped by its timer;
          // the server goes on.
        }
      }
    });
  }
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(
      net::make_strand(io_),
      [self = shared_from_this()](const boost::system::error_code& error, tcp::socket socket) {
        self->OnAccept(error, std::move(socket));
      });
}

void HttpServer::Impl::OnAccept(const boost::system::error_code& error, tcp::socket socket) {
  if (error == net::error::operation_aborted || !acceptor_.is_open()) return;
  if (!error) {
    std::shared_ptr<Connection> connection;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (static_cast<int>(connections_.size()) >= options_.max_connections) {
        if (!tls_) {  // a plain client hears why; TLS ones see the close
          const std::string body =
              OpenAiErrorJson(absl::StrCat("too many connections (", options_.max_connections, ")"),
                              "unavailable", 503);
          const std::string busy = absl::StrCat(
              "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
              "Connection: close\r\nContent-Length: ",
              body.size(), "\r\n\r\n", body);
          boost::system::error_code ignored;
          net::write(socket, net::buffer(busy), ignored);
        }
      } else {
        connection =
            tls_ ? http_connection::NewTlsConnection(shared_from_this(), std::move(socket), *tls_)
                 : http_connection::NewConnection(shared_from_this(), std::move(socket));
        connections_[connection.get()] = connection;
      }
    }
    if (connection) connection->Start();
  }
  Accept();  // accept errors (out of descriptors, ...) pass; the listener goes on
}

void HttpServer::Impl::Dispatch(const HttpRequest& request,
                                const std::shared_ptr<HttpReply>& reply) {
  std::shared_ptr<HttpHandler> handler;
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    handler = handler_;
    draining = draining_;
  }
  const bool get = request.method == "GET" || request.method == "HEAD";
  // Kubernetes' probe paths: /livez 200 while the process answers at all (loading and draining
  // included); /readyz is /health (503 while loading or draining).
  if (get && request.path == "/livez") return reply->Send(HealthJson(200, "alive"));
  const bool readiness = get && (request.path == "/health" || request.path == "/readyz");
  if (readiness && (draining || handler == nullptr)) {
    return reply->Send(HealthJson(503, draining ? "draining" : "loading"));
  }
  if (handler == nullptr) return reply->Send(Error(503, "the server is loading", "unavailable"));
  try {
    if (readiness && request.path == "/readyz") {
      HttpRequest health = request;
      health.path = "/health";
      if (handler->Handle(health, reply)) return;
    }
    if (handler->Handle(request, reply)) return;
  } catch (const std::exception&) {
    return reply->Send(Error(500, "internal error", "internal_error"));
  }
  reply->Send(Error(404, absl::StrCat("no such endpoint: ", request.method, " ", request.path),
                    "invalid_request_error"));
}

void HttpServer::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  net::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->acceptor_.close(ignored);
  });
  std::vector<std::shared_ptr<Connection>> open;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [key, weak] : connections_) {
      if (std::shared_ptr<Connection> connection = weak.lock()) open.push_back(connection);
    }
  }
  for (const std::shared_ptr<Connection>& connection : open) connection->Close();
  open.clear();
  work_.reset();  // from here the threads end once every close above has run
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  // Shared: the connections keep it (and the I/O context their sockets live on) alive.
  auto impl = std::make_shared<Impl>(std::move(options));
  if (absl::Status listening = impl->Listen(); !listening.ok()) return listening;
  impl->Run();
  return std::unique_ptr<HttpServer>(new HttpServer(impl));
}

HttpServer::~HttpServer() { Stop(); }
const std::string& HttpServer::address() const { return impl_->address(); }
void HttpServer::SetHandler(std::shared_ptr<HttpHandler> handler) {
  impl_->SetHandler(std::move(handler));
}
void HttpServer::SetDraining() { impl_->SetDraining(); }
int HttpServer::connections() const { return impl_->connections(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace scd
