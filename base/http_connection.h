// One HTTP connection of base/http_server.h as a state object on its strand (Boost.Asio): TLS
// handshake, read a request under the limits, hand it to the server, write the answer it gets
// through its HttpReply (whole or chunked, with back-pressure), then the next request or close.
// Internal to base/'s HTTP files; the server owns the listening side and the handler.
// Thread-safety: a Connection's own steps run on its strand; ConnectionReply is thread-safe.
#ifndef SCD_BASE_HTTP_CONNECTION_H_
#define SCD_BASE_HTTP_CONNECTION_H_

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/http_beast.h"
#include "base/http_message.h"

namespace scd::http_connection {

using ErrorCode = boost::system::error_code;
using tcp = boost::asio::ip::tcp;

// The server's side of a connection: its limits, where requests go, its bookkeeping.
class Host {
 public:
  virtual ~Host() = default;
  struct Timeouts {
    int read_seconds = 30;
    int write_seconds = 30;
    size_t max_queued_bytes = 4u << 20;
  };
  virtual const HttpLimits& limits() const = 0;
  virtual const Timeouts& timeouts() const = 0;
  virtual void Dispatch(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) = 0;
  virtual void Closed(const void* connection) = 0;
};

class Connection;

// The exchange of one request: what the handler wrote and the connection has not yet written.
class ConnectionReply final : public HttpReply {
 public:
  ConnectionReply(std::weak_ptr<Connection> connection, bool keep_alive, bool head_only,
                  size_t max_queued_bytes);
  void Send(HttpResponse response) override;
  void StartStream(HttpResponse head) override;
  bool Write(std::string data) override;
  void End() override;
  void OnRoom(std::function<void()> room) override;
  void OnClosed(std::function<void()> closed) override;

  // The connection's side, on its strand.
  struct Taken {
    std::string bytes;   // to write next ("" = nothing now)
    bool ended = false;  // the answer is complete once `bytes` are written
  };
  Taken Take();
  void Written(size_t bytes);  // calls the room callback when the queue fell under the mark
  void Complete();             // sent in full: OnClosed will not be called
  void Close();                // the connection closed first: OnRoom and OnClosed fire
  bool keep_alive() const { return keep_alive_; }

 private:
  void Enqueue(std::string bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::weak_ptr<Connection> connection_;
  const bool keep_alive_;
  const bool head_only_;
  const size_t max_queued_bytes_;
  absl::Mutex mu_;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool streaming_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  bool flush_posted_ ABSL_GUARDED_BY(mu_) = false;
  std::string pending_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // pending plus being written
  std::function<void()> room_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_closed_ ABSL_GUARDED_BY(mu_);
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `host` outlives the connection (the server keeps itself alive for its connections).
  Connection(std::shared_ptr<Host> host, boost::asio::any_io_executor strand, bool tls);
  virtual ~Connection() = default;

  void Start();  // posts the first step
  void Close();  // posts the close (the server's stop)
  // A reply has bytes to write (from any thread).
  void PostFlush();

 protected:
  using Done = std::function<void(const ErrorCode&)>;
  using DoneSize = std::function<void(const ErrorCode&, size_t)>;
  virtual void AsyncHandshake(Done done) = 0;
  virtual void AsyncReadRequest(http_beast::RequestParser& parser,
                                boost::beast::flat_buffer& buffer, DoneSize done) = 0;
  virtual void AsyncReadSome(boost::asio::mutable_buffer into, DoneSize done) = 0;
  virtual void AsyncWrite(const std::string& bytes, DoneSize done) = 0;
  virtual void AsyncShutdown(Done done) = 0;
  virtual tcp::socket::lowest_layer_type& Socket() = 0;

 private:
  void NextRequest();
  void OnRequest(const ErrorCode& error);
  void Watch();
  void OnWatchRead(const ErrorCode& error, size_t bytes);
  void Drain();
  void Flush();
  void OnWritten(const ErrorCode& error, size_t bytes);
  void FinishExchange();
  void CloseNow();
  void Arm(int seconds);
  void Disarm();

  const std::shared_ptr<Host> host_;
  const boost::asio::any_io_executor strand_;
  const bool tls_;
  // On the strand.
  boost::asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  std::optional<http_beast::RequestParser> parser_;
  boost::beast::flat_buffer buffer_;
  std::shared_ptr<ConnectionReply> reply_;
  std::string writing_;     // the bytes being written ("" = no write under way)
  bool watching_ = false;   // a read that notices the client's close is under way
  bool want_next_ = false;  // that read's end starts the next request
  bool draining_ = false;   // the last answer went out: reads are dropped until the client closes
  bool closed_ = false;
};

// A connection over a plain socket or TLS (both accepted onto a strand).
std::shared_ptr<Connection> NewConnection(std::shared_ptr<Host> host, tcp::socket socket);
std::shared_ptr<Connection> NewTlsConnection(std::shared_ptr<Host> host, tcp::socket socket,
                                             boost::asio::ssl::context& context);

}  // namespace scd::http_connection

#endif  // SCD_BASE_HTTP_CONNECTION_H_
