#include "base/http_connection.h"

#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace scd::http_connection {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;

constexpr size_t kLowMark = 64 << 10;       // a stream writes on while less than this is queued
constexpr size_t kWatchBytes = 4 << 10;     // one read while an answer is pending
constexpr size_t kMaxPipelined = 64 << 10;  // bytes read ahead of the next request, at most
constexpr int kLingerSeconds = 5;  // a closing connection waits this long for the client's close

// A header's text with no line breaks (a handler's value cannot add headers).
std::string HeaderText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c != '\r' && c != '\n') out.push_back(c);
  }
  return out;
}

// The status line and headers; `content_length` < 0: a chunked body.
std::string Head(const HttpResponse& response, int64_t content_length, bool keep_alive) {
  const boost::beast::string_view reason_text =
      http::obsolete_reason(static_cast<http::status>(response.status));
  const absl::string_view reason(reason_text.data(), reason_text.size());
  std::string head = absl::StrCat("HTTP/1.1 ", response.status, " ", reason, "\r\n");
  if (!response.content_type.empty()) {
    absl::StrAppend(&head, "Content-Type: ", HeaderText(response.content_type), "\r\n");
  }
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&head, HeaderText(name), ": ", HeaderText(value), "\r\n");
  }
  if (content_length < 0) {
    absl::StrAppend(&head, "Transfer-Encoding: chunked\r\n");
  } else {
    absl::StrAppend(&head, "Content-Length: ", content_length, "\r\n");
  }
  if (!keep_alive) absl::StrAppend(&head, "Connection: close\r\n");
  return head + "\r\n";
}

}  // namespace

ConnectionReply::ConnectionReply(std::weak_ptr<Connection> connection, bool keep_alive,
                                 bool head_only, size_t max_queued_bytes)
    : connection_(std::move(connection)),
      keep_alive_(keep_alive),
      head_only_(head_only),
      max_queued_bytes_(max_queued_bytes) {}

void ConnectionReply::Enqueue(std::string bytes) {
  queued_ += bytes.size();
  pending_ += bytes;
  if (flush_posted_) return;
  flush_posted_ = true;
  if (std::shared_ptr<Connection> connection = connection_.lock()) connection->PostFlush();
}

void ConnectionReply::Send(HttpResponse response) {
  absl::MutexLock lock(&mu_);
  if (answered_ || closed_) return;
  answered_ = ended_ = true;
  std::string bytes = Head(response, static_cast<int64_t>(response.body.size()), keep_alive_);
  if (!head_only_) bytes += response.body;
  Enqueue(std::move(bytes));
}

void ConnectionReply::StartStream(HttpResponse head) {
  absl::MutexLock lock(&mu_);
  if (answered_ || closed_) return;
  answered_ = streaming_ = true;
  Enqueue(Head(head, -1, keep_alive_));
  if (head_only_) {
    ended_ = true;
    Enqueue("0\r\n\r\n");
  }
}

bool ConnectionReply::Write(std::string data) {
  absl::MutexLock lock(&mu_);
  if (closed_ || !streaming_ || ended_) return true;
  if (!data.empty()) Enqueue(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
  if (queued_ <= max_queued_bytes_) return queued_ < kLowMark;
  // The client lets too much pile up: dropped. Posted under the lock, as every post of a reply
  // is: once the connection closed it (Close), nothing more is posted to its strand.
  if (std::shared_ptr<Connection> too_slow = connection_.lock()) too_slow->Close();
  return true;
}

void ConnectionReply::End() {
  absl::MutexLock lock(&mu_);
  if (closed_ || !streaming_ || ended_) return;
  ended_ = true;
  Enqueue("0\r\n\r\n");
}

void ConnectionReply::OnRoom(std::function<void()> room) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_ && queued_ >= kLowMark) {
      room_ = std::move(room);
      return;
    }
  }
  room();
}

void ConnectionReply::OnClosed(std::function<void()> closed) {
  {
    absl::MutexLock lock(&mu_);
    if (complete_) return;
    if (!closed_) {
      on_closed_ = std::move(closed);
      return;
    }
  }
  closed();
}

ConnectionReply::Taken ConnectionReply::Take() {
  absl::MutexLock lock(&mu_);
  flush_posted_ = false;
  Taken taken;
  taken.bytes.swap(pending_);
  taken.ended = ended_;
  return taken;
}

void ConnectionReply::Written(size_t bytes) {
  std::function<void()> room;
  {
    absl::MutexLock lock(&mu_);
    queued_ -= std::min(queued_, bytes);
    if (queued_ < kLowMark) room.swap(room_);
  }
  if (room) room();
}

void ConnectionReply::Complete() {
  absl::MutexLock lock(&mu_);
  complete_ = true;
  on_closed_ = nullptr;
}

void ConnectionReply::Close() {
  std::function<void()> room, closed;
  {
    absl::MutexLock lock(&mu_);
    if (complete_ || closed_) return;
    closed_ = true;
    room.swap(room_);
    closed.swap(on_closed_);
    pending_.clear();
  }
  if (closed) closed();  // first: a writer woken by `room` sees that it was closed
  if (room) room();
}

Connection::Connection(std::shared_ptr<Host> host, net::any_io_executor strand, bool tls)
    : host_(std::move(host)), strand_(strand), tls_(tls), timer_(strand) {}

void Connection::Start() {
  net::post(strand_, [self = shared_from_this()] {
    if (!self->tls_) return self->NextRequest();
    self->Arm(self->host_->timeouts().read_seconds);
    self->AsyncHandshake([self](const ErrorCode& error) {
      self->Disarm();
      if (error || self->closed_) return self->CloseNow();
      self->NextRequest();
    });
  });
}

void Connection::Close() {
  net::post(strand_, [self = shared_from_this()] { self->CloseNow(); });
}

void Connection::PostFlush() {
  net::post(strand_, [self = shared_from_this()] { self->Flush(); });
}

void Connection::Arm(int seconds) {
  const uint64_t generation = ++timer_generation_;
  timer_.expires_after(std::chrono::seconds(seconds));
  timer_.async_wait([self = shared_from_this(), generation](const ErrorCode& error) {
    if (!error && generation == self->timer_generation_) self->CloseNow();
  });
}

void Connection::Disarm() {
  ++timer_generation_;
  timer_.cancel();
}

void Connection::NextRequest() {
  if (closed_) return;
  Arm(host_->timeouts().read_seconds);  // the whole request, or the idle time before it
  if (watching_) {  // ended (cancelled) first: the next request may be in the buffer already
    want_next_ = true;
    ErrorCode ignored;
    Socket().cancel(ignored);
    return;
  }
  parser_.emplace();
  http_beast::LimitParser(*parser_, host_->limits());
  AsyncReadRequest(*parser_, buffer_, [self = shared_from_this()](const ErrorCode& error, size_t) {
    self->OnRequest(error);
  });
}

void Connection::OnRequest(const ErrorCode& error) {
  Disarm();
  if (closed_) return;
  if (error) {
    // A malformed or oversized request is answered (then closed); a client that went away or
    // stopped mid-request is not.
    if (error.category() != http::make_error_code(http::error::body_limit).category() ||
        error == http::error::end_of_stream || error == http::error::partial_message) {
      return CloseNow();
    }
    const int status = http_beast::StatusOfParseError(error);
    const std::string message =
        status == 413   ? absl::StrCat("the request body is too large (limit ",
                                       host_->limits().max_body_bytes, " bytes)")
        : status == 431 ? absl::StrCat("the request head is too large (limit ",
                                       host_->limits().max_header_bytes, " bytes)")
                        : absl::StrCat("a malformed HTTP request: ", error.message());
    reply_ = std::make_shared<ConnectionReply>(weak_from_this(), false, false,
                                               host_->timeouts().max_queued_bytes);
    reply_->Send(
        HttpResponse::Json(status, OpenAiErrorJson(message, "invalid_request_error", status)));
    return;
  }
  ErrorCode ignored;
  const tcp::endpoint remote = Socket().remote_endpoint(ignored);
  HttpRequest request =
      http_beast::ToHttpRequest(*parser_, ignored ? "" : remote.address().to_string());
  parser_.reset();
  reply_ = std::make_shared<ConnectionReply>(weak_from_this(), request.keep_alive,
                                             request.method == "HEAD",
                                             host_->timeouts().max_queued_bytes);
  Watch();
  std::shared_ptr<HttpReply> reply = reply_;
  host_->Dispatch(request, reply);
}

// While an answer is pending, a read notices a client that closes (its request is then
// cancelled through OnClosed); what it reads is the next request's start.
void Connection::Watch() {
  if (watching_ || closed_ || buffer_.size() >= kMaxPipelined) return;
  watching_ = true;
  AsyncReadSome(buffer_.prepare(kWatchBytes),
                [self = shared_from_this()](const ErrorCode& error, size_t bytes) {
                  self->OnWatchRead(error, bytes);
                });
}

void Connection::OnWatchRead(const ErrorCode& error, size_t bytes) {
  watching_ = false;
  if (closed_) return;
  if (error && !(error == boost::asio::error::operation_aborted && want_next_)) return CloseNow();
  buffer_.commit(bytes);
  if (draining_) return Drain();
  if (want_next_) {
    want_next_ = false;
    return NextRequest();
  }
  if (reply_) Watch();
}

// After the last answer on a connection that closes: what the client still sends (the rest of
// a refused body) is read and dropped until it closes too, so that its unread bytes do not
// reset the connection before the client has read the answer.
void Connection::Drain() {
  draining_ = true;
  if (watching_ || closed_) return;
  buffer_.consume(buffer_.size());
  Watch();
}

void Connection::Flush() {
  if (closed_ || !reply_ || !writing_.empty()) return;
  ConnectionReply::Taken taken = reply_->Take();
  if (taken.bytes.empty()) {
    if (taken.ended) FinishExchange();
    return;
  }
  writing_ = std::move(taken.bytes);
  Arm(host_->timeouts().write_seconds);
  AsyncWrite(writing_, [self = shared_from_this()](const ErrorCode& error, size_t bytes) {
    self->OnWritten(error, bytes);
  });
}

void Connection::OnWritten(const ErrorCode& error, size_t bytes) {
  Disarm();
  writing_.clear();
  if (closed_) return;
  if (error) return CloseNow();
  std::shared_ptr<ConnectionReply> reply = reply_;
  reply->Written(bytes);  // may call the handler's room callback (which may write more)
  Flush();
}

void Connection::FinishExchange() {
  std::shared_ptr<ConnectionReply> reply = std::move(reply_);
  reply->Complete();
  if (reply->keep_alive()) return NextRequest();
  Arm(std::min(kLingerSeconds, host_->timeouts().write_seconds));
  AsyncShutdown([self = shared_from_this()](const ErrorCode& error) {
    if (error || self->tls_) return self->CloseNow();
    self->Drain();
  });
}

void Connection::CloseNow() {
  if (closed_) return;
  closed_ = true;
  Disarm();
  ErrorCode ignored;
  Socket().shutdown(tcp::socket::shutdown_both, ignored);
  Socket().close(ignored);
  if (std::shared_ptr<ConnectionReply> reply = std::move(reply_)) reply->Close();
  host_->Closed(this);
}

namespace {

// The transport's calls for a stream type: a plain socket or TLS over one.
template <typename Stream>
class StreamConnection final : public Connection {
 public:
  template <typename... Args>
  StreamConnection(std::shared_ptr<Host> host, bool tls, tcp::socket socket, Args&&... args)
      : Connection(std::move(host), socket.get_executor(), tls),
        stream_(std::move(socket), std::forward<Args>(args)...) {}

 protected:
  void AsyncHandshake(Done done) override {
    if constexpr (std::is_same_v<Stream, tcp::socket>) {
      net::post(stream_.get_executor(), [done] { done(ErrorCode()); });
    } else {
      stream_.async_handshake(net::ssl::stream_base::server, std::move(done));
    }
  }
  void AsyncReadRequest(http_beast::RequestParser& parser, boost::beast::flat_buffer& buffer,
                        DoneSize done) override {
    http::async_read(stream_, buffer, parser, std::move(done));
  }
  void AsyncReadSome(net::mutable_buffer into, DoneSize done) override {
    stream_.async_read_some(into, std::move(done));
  }
  void AsyncWrite(const std::string& bytes, DoneSize done) override {
    net::async_write(stream_, net::buffer(bytes), std::move(done));
  }
  void AsyncShutdown(Done done) override {
    if constexpr (std::is_same_v<Stream, tcp::socket>) {
      ErrorCode ignored;
      stream_.shutdown(tcp::socket::shutdown_send, ignored);
      net::post(stream_.get_executor(), [done] { done(ErrorCode()); });
    } else {
      stream_.async_shutdown(std::move(done));  // TLS close_notify
    }
  }
  tcp::socket::lowest_layer_type& Socket() override { return stream_.lowest_layer(); }

 private:
  Stream stream_;
};

}  // namespace

std::shared_ptr<Connection> NewConnection(std::shared_ptr<Host> host, tcp::socket socket) {
  return std::make_shared<StreamConnection<tcp::socket>>(std::move(host), false, std::move(socket));
}

std::shared_ptr<Connection> NewTlsConnection(std::shared_ptr<Host> host, tcp::socket socket,
                                             net::ssl::context& context) {
  return std::make_shared<StreamConnection<net::ssl::stream<tcp::socket>>>(
      std::move(host), true, std::move(socket), context);
}

}  // namespace scd::http_connection
