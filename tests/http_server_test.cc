// base/http_server.h against independent clients: cpp-httplib's client (whole and chunked
// answers), curl (TLS), and raw sockets for what a client library hides (pipelined requests,
// limits, a client that stops reading or goes away). Waits are on events (a handler's callback,
// the socket's close); the only timing is the server's own limits, set to 1 s where a test
// needs one to expire, and each such wait allows 30 s (a loaded machine takes longer, never
// forever).
#include "base/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/host_port.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

// A handler the test drives: fixed answers by path, or the reply kept for the test to answer.
class TestHandler : public HttpHandler {
 public:
  bool Handle(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) override {
    if (request.path == "/hello") {
      reply->Send(HttpResponse::Json(200, absl::StrCat("{\"body\":", request.body.size(), "}")));
      return true;
    }
    if (request.path == "/held") {
      absl::MutexLock lock(&mu_);
      held_.push_back(reply);
      return true;
    }
    if (request.path == "/throw") throw std::runtime_error("a handler's bug");
    return false;
  }
  // The replies held so far, once there are `n`.
  std::vector<std::shared_ptr<HttpReply>> Held(size_t n) {
    absl::MutexLock lock(&mu_);
    wanted_ = n;
    mu_.Await(absl::Condition(this, &TestHandler::Enough));
    return held_;
  }

 private:
  bool Enough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= wanted_; }
  absl::Mutex mu_;
  std::vector<std::shared_ptr<HttpReply>> held_ ABSL_GUARDED_BY(mu_);
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<HttpServer> Serve(HttpServerOptions options = {}) {
  if (options.listen.empty()) options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

int Port(const HttpServer& server) { return ParseHostPort(server.address()).value().port; }

// A raw TCP client; reads wait at most 30 s.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval timeout{30, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) { (void)!write(fd_, bytes.data(), bytes.size()); }
  // What arrives until `marker` was seen `count` times, the peer closed, or 30 s passed.
  std::string ReadUntil(const std::string& marker, int count = 1) {
    std::string got;
    char buffer[4096];
    while (Count(got, marker) < count) {
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
    return got;
  }
  // True when the server closed the connection (read returns 0 or a reset) within 30 s.
  bool ClosedByServer() {
    char buffer[4096];
    for (;;) {
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n < 0) return false;  // the 30 s passed
    }
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  static int Count(const std::string& text, const std::string& marker) {
    int n = 0;
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
      ++n;
    }
    return n;
  }
  int fd_;
  bool connected_ = false;
};

// A TestHandler installed on `server`.
std::shared_ptr<TestHandler> Handled(HttpServer& server) {
  auto handler = std::make_shared<TestHandler>();
  server.SetHandler(handler);
  return handler;
}

// Sends GET /held on `client`: the reply the handler holds for it (its `nth`, from 0), with
// `closed` notified when the exchange closes.
std::shared_ptr<HttpReply> HoldOne(TestHandler& handler, RawClient& client, size_t nth,
                                   absl::Notification* closed) {
  client.Send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n");
  std::shared_ptr<HttpReply> reply = handler.Held(nth + 1)[nth];
  reply->OnClosed([closed] { closed->Notify(); });
  return reply;
}

TEST(HttpServerTest, HealthIsLoadingThenServingThenDraining) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", Port(*server));
  auto loading = client.Get("/health");
  ASSERT_TRUE(loading);
  EXPECT_EQ(loading->status, 503);
  EXPECT_EQ(loading->body, "{\"status\":\"loading\"}");
  EXPECT_EQ(client.Get("/readyz")->status, 503);
  EXPECT_EQ(client.Get("/livez")->status, 200);
  auto other = client.Get("/v1/models");
  EXPECT_EQ(other->status, 503);
  EXPECT_THAT(other->body, HasSubstr("\"type\":\"unavailable\""));

  MetricsRegistry metrics;
  server->SetHandler(std::make_shared<MetricsHttpHandler>(&metrics));
  auto serving = client.Get("/health");
  EXPECT_EQ(serving->status, 200);
  EXPECT_EQ(serving->body, "{\"status\":\"serving\"}");
  EXPECT_EQ(client.Get("/readyz")->body, "{\"status\":\"serving\"}");
  EXPECT_EQ(client.Get("/livez")->body, "{\"status\":\"alive\"}");
  auto exposition = client.Get("/metrics");
  EXPECT_EQ(exposition->status, 200);
  EXPECT_THAT(exposition->get_header_value("Content-Type"), HasSubstr("text/plain"));
  auto missing = client.Get("/nowhere");
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("no such endpoint: GET /nowhere"));
  server->SetDraining();
  EXPECT_EQ(client.Get("/health")->body, "{\"status\":\"draining\"}");
  EXPECT_EQ(client.Get("/readyz")->status, 503);
  EXPECT_EQ(client.Get("/livez")->status, 200);
}

TEST(HttpServerTest, LimitsAndMalformedRequestsAreAnsweredInOpenAisShape) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  options.max_header_bytes = 4096;
  auto server = Serve(options);
  ASSERT_NE(server, nullptr);
  Handled(*server);
  httplib::Client client("127.0.0.1", Port(*server));
  auto fits = client.Post("/hello", std::string(1024, 'x'), "text/plain");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->body, "{\"body\":1024}");
  auto too_big = client.Post("/hello", std::string(64 << 10, 'x'), "text/plain");
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->status, 413);
  EXPECT_THAT(too_big->body, HasSubstr("too large (limit 1024 bytes)"));
  auto long_head = client.Get("/hello", {{"X-Long", std::string(8192, 'h')}});
  ASSERT_TRUE(long_head);
  EXPECT_EQ(long_head->status, 431);
  auto thrown = client.Get("/throw");
  EXPECT_EQ(thrown->status, 500);
  EXPECT_THAT(thrown->body, HasSubstr("\"type\":\"internal_error\""));

  RawClient raw(Port(*server));
  raw.Send("NOT HTTP AT ALL\r\n\r\n");
  const std::string answer = raw.ReadUntil("}}");
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 400"));
  EXPECT_THAT(answer, HasSubstr("malformed HTTP request"));
  EXPECT_TRUE(raw.ClosedByServer());
}

TEST(HttpServerTest, PipelinedRequestsOnOneConnectionAreAnsweredInOrder) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  Handled(*server);
  RawClient raw(Port(*server));
  raw.Send(
      "POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
      "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string answers = raw.ReadUntil("}", 2);
  EXPECT_THAT(answers, HasSubstr("{\"body\":3}"));
  EXPECT_THAT(answers, HasSubstr("{\"body\":0}"));
  EXPECT_LT(answers.find("{\"body\":3}"), answers.find("{\"body\":0}"));
  EXPECT_EQ(server->connections(), 1);
}

// A streamed answer written from another thread, honouring the reply's room, reaches an
// independent client's chunked decoder byte for byte.
TEST(HttpServerTest, AStreamWrittenFromAnotherThreadArrivesWhole) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  auto handler = Handled(*server);
  std::string expected;
  for (int i = 0; i < 2000; ++i) expected += absl::StrCat("data: chunk ", i, "\n\n");
  std::thread writer([&] {
    std::shared_ptr<HttpReply> reply = handler->Held(1)[0];
    HttpResponse head;
    head.content_type = "text/event-stream";
    reply->StartStream(head);
    for (int i = 0; i < 2000; ++i) {
      if (!reply->Write(absl::StrCat("data: chunk ", i, "\n\n"))) {
        absl::Notification room;
        reply->OnRoom([&room] { room.Notify(); });
        room.WaitForNotification();
      }
    }
    reply->End();
  });
  httplib::Client client("127.0.0.1", Port(*server));
  std::string got;
  auto streamed = client.Get("/held", [&](const char* data, size_t n) {
    got.append(data, n);
    return true;
  });
  writer.join();
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(got, expected);
}

TEST(HttpServerTest, AClientThatGoesAwayClosesItsPendingAnswer) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  auto handler = Handled(*server);
  RawClient raw(Port(*server));
  absl::Notification closed;
  std::shared_ptr<HttpReply> reply = HoldOne(*handler, raw, 0, &closed);
  raw.Close();
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  reply->Send(HttpResponse::Json(200, "{}"));  // too late: nothing happens
}

// A client that stops reading: once the kernel's buffers are full, a write makes no progress
// for write_timeout_seconds and the connection is dropped; a handler that ignores the room it
// is given and piles up more than max_queued_bytes is dropped at once.
TEST(HttpServerTest, ASlowReaderIsDropped) {
  HttpServerOptions options;
  options.write_timeout_seconds = 1;
  options.max_queued_bytes = 1 << 20;
  auto server = Serve(options);
  ASSERT_NE(server, nullptr);
  auto handler = Handled(*server);
  RawClient stalled(Port(*server));
  absl::Notification closed;
  std::shared_ptr<HttpReply> reply = HoldOne(*handler, stalled, 0, &closed);
  reply->StartStream(HttpResponse());
  const std::string piece(16 << 10, 'p');
  std::function<void()> write_on = [&] {
    while (!closed.HasBeenNotified() && reply->Write(piece)) {
    }
    // Honours back-pressure: only the stall can end it.
    if (!closed.HasBeenNotified()) reply->OnRoom(write_on);
  };
  write_on();
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(30)));

  RawClient piling(Port(*server));
  absl::Notification dropped;
  std::shared_ptr<HttpReply> ignoring = HoldOne(*handler, piling, 1, &dropped);
  ignoring->StartStream(HttpResponse());
  for (int i = 0; i < 4 && !dropped.HasBeenNotified(); ++i)
    ignoring->Write(std::string(1 << 20, 'q'));
  EXPECT_TRUE(dropped.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(HttpServerTest, ARequestNotSentInTimeIsDropped) {
  HttpServerOptions options;
  options.read_timeout_seconds = 1;
  auto server = Serve(options);
  ASSERT_NE(server, nullptr);
  Handled(*server);
  RawClient partial(Port(*server));
  partial.Send("GET /hello HTTP/1.1\r\nHost: x\r\n");  // the head never ends
  EXPECT_TRUE(partial.ClosedByServer());
  RawClient idle(Port(*server));  // kept alive after one answer, then silent
  idle.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(idle.ReadUntil("}"), HasSubstr("{\"body\":0}"));
  EXPECT_TRUE(idle.ClosedByServer());
}

TEST(HttpServerTest, ConnectionsPastTheLimitAreRefused) {
  HttpServerOptions options;
  options.max_connections = 2;
  auto server = Serve(options);
  ASSERT_NE(server, nullptr);
  Handled(*server);
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < 2; ++i) {  // each answered once: the server holds both
    open.push_back(std::make_unique<RawClient>(Port(*server)));
    open.back()->Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_THAT(open.back()->ReadUntil("}"), HasSubstr("200 OK"));
  }
  RawClient third(Port(*server));
  third.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refused = third.ReadUntil("}}");
  EXPECT_THAT(refused, HasSubstr("HTTP/1.1 503"));
  EXPECT_THAT(refused, HasSubstr("too many connections (2)"));
  open.clear();
}

int Threads() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++n;
  }
  return n;
}

// 300 answers pending at once on the server's 2 I/O threads: no thread per connection; then
// each is answered and every client reads its own.
TEST(HttpServerTest, ManyPendingAnswersHoldNoThreads) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  auto handler = Handled(*server);
  const int before = Threads();
  constexpr int kClients = 300;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawClient>(Port(*server)));
    ASSERT_TRUE(clients.back()->connected());
    clients.back()->Send(absl::StrCat("GET /held?i=", i, " HTTP/1.1\r\nHost: x\r\n\r\n"));
  }
  std::vector<std::shared_ptr<HttpReply>> held = handler->Held(kClients);
  EXPECT_EQ(Threads(), before);
  EXPECT_EQ(server->connections(), kClients);
  for (size_t i = 0; i < held.size(); ++i) {
    held[i]->StartStream(HttpResponse());
    held[i]->Write(absl::StrCat("answer ", i, "."));
    held[i]->End();
  }
  int answered = 0;
  for (auto& client : clients)
    answered += client->ReadUntil("0\r\n\r\n").find("answer ") != std::string::npos;
  EXPECT_EQ(answered, kClients);
}

TEST(HttpServerTest, StopClosesPendingAnswers) {
  auto server = Serve();
  ASSERT_NE(server, nullptr);
  auto handler = Handled(*server);
  RawClient raw(Port(*server));
  absl::Notification closed;
  std::shared_ptr<HttpReply> reply = HoldOne(*handler, raw, 0, &closed);
  server->Stop();
  EXPECT_TRUE(closed.HasBeenNotified());
  EXPECT_TRUE(raw.ClosedByServer());
  reply->Write("after the stop");  // ignored, no crash
  reply->End();
}

TEST(HttpServerTest, HttpsWithTheGivenCertificate) {
  testing::TempDir dir;
  const testing::CommandResult made = testing::RunCommand(absl::StrCat(
      "cd ", dir.path(),
      " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && openssl req -x509 -newkey "
      "rsa:2048 -nodes -keyout key.pem -out cert.pem -days 2 -subj /CN=127.0.0.1 -addext "
      "subjectAltName=IP:127.0.0.1 2>/dev/null"));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  HttpServerOptions options;
  options.tls_cert = dir.File("cert.pem");
  options.tls_key = dir.File("key.pem");
  auto server = Serve(options);
  ASSERT_NE(server, nullptr);
  Handled(*server);
  const std::string port = absl::StrCat(Port(*server));
  const testing::CommandResult https =
      testing::RunCommand("curl -s -m 30 --cacert " + dir.File("cert.pem") +
                          " https://127.0.0.1:" + port + "/hello -d abcd");
  EXPECT_EQ(https.out, "{\"body\":4}") << https.err;
  const testing::CommandResult plain = testing::RunCommand(
      "curl -s -m 30 -o /dev/null -w '%{http_code}' http://127.0.0.1:" + port + "/hello");
  EXPECT_NE(plain.out, "200");

  options.listen = "127.0.0.1:0";
  options.tls_key = dir.File("cert.pem");  // not a key
  absl::StatusOr<std::unique_ptr<HttpServer>> bad = HttpServer::Start(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cannot use the certificate"));
}

TEST(HttpServerTest, ParseHttpRequestIsTheServersParser) {
  HttpLimits limits;
  limits.max_body_bytes = 16;
  absl::StatusOr<HttpRequest> request = ParseHttpRequest(
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: h\r\nAUTHORIZATION: Bearer t\r\n"
      "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
      limits);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->method, "POST");
  EXPECT_EQ(request->path, "/v1/completions");
  EXPECT_EQ(request->query, "x=1");
  EXPECT_EQ(request->Header("authorization"), "Bearer t");
  EXPECT_EQ(request->body, "abcde");
  EXPECT_EQ(
      ParseHttpRequest("POST / HTTP/1.1\r\nContent-Length: 17\r\n\r\n", limits).status().code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ParseHttpRequest("GET / HTTP/1.1\r\nHost: h\r\n", limits).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHttpRequest("", limits).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ParseHttpRequest("POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nab", limits).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHttpRequest("\x01\x02 nonsense", limits).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace scd
