// Tests of the gRPC transport backend (transport/grpc/grpc_transport.h) over loopback: frame
// mapping and reassembly, lane priority, link-down semantics, errors, interop with a plain protobuf
// peer, and a rough bandwidth print.
#include "transport/grpc/grpc_transport.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/message_differencer.h"
#include "scd/v1/transfer.grpc.pb.h"
#include "scd/v1/transfer.pb.h"
#include "spdlog/spdlog.h"
#include "tests/freezable_proxy.h"
#include "tests/transport_test_util.h"
#include "transport/grpc/grpc_link.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;
using ::scd::testing::PatternBytes;
using ::scd::testing::SettledLiveBuffers;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;

// A chunk frame's meta as a message, for the protobuf peer.
v1::TransferFrame ChunkFrameMeta(uint64_t session, uint32_t index, uint64_t payload_bytes) {
  v1::TransferFrame meta;
  const std::string zeros(payload_bytes, '\0');
  EXPECT_TRUE(meta.ParseFromString(
      testing::ValidChunk(session, index, Payload::Copy(zeros.data(), zeros.size())).meta));
  return meta;
}

// ---- setup ----

TransportOptions GrpcOptions() {
  TransportOptions options;
  options.backend = "grpc";
  return options;
}

std::unique_ptr<Transport> NewTransport(const TransportOptions& options = GrpcOptions()) {
  absl::StatusOr<std::unique_ptr<Transport>> transport = NewGrpcTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? *std::move(transport) : nullptr;
}

// A listening transport and a connecting one with one link between them.
struct LinkPair {
  std::unique_ptr<Transport> server_transport;
  std::unique_ptr<Transport> client_transport;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Link> client;
  std::unique_ptr<Link> server;
};

LinkPair Connected(const TransportOptions& options = GrpcOptions()) {
  LinkPair pair;
  pair.server_transport = NewTransport(options);
  pair.client_transport = NewTransport(options);
  absl::StatusOr<std::unique_ptr<Listener>> listener = pair.server_transport->Listen("127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return pair;
  pair.listener = *std::move(listener);
  absl::StatusOr<std::unique_ptr<Link>> client =
      pair.client_transport->Connect(pair.listener->address(), absl::Seconds(5));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return pair;
  pair.client = *std::move(client);
  absl::StatusOr<std::unique_ptr<Link>> server = pair.listener->Accept(absl::Seconds(5));
  EXPECT_TRUE(server.ok()) << server.status();
  if (server.ok()) pair.server = *std::move(server);
  return pair;
}

// Counts what arrives and drops the payloads at once (bandwidth runs).
class CountingHandler : public LinkHandler {
 public:
  void OnFrame(Frame) override {
    absl::MutexLock lock(&mu_);
    ++frames_;
  }
  void OnLinkDown(absl::Status) override {}
  bool WaitForFrames(size_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  absl::Mutex mu_;
  size_t frames_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---- tests ----

TEST(GrpcTransportTest, Capabilities) {
  std::unique_ptr<Transport> transport = NewTransport();
  ASSERT_NE(transport, nullptr);
  const Capabilities& caps = transport->capabilities();
  EXPECT_EQ(caps.backend, "grpc");
  EXPECT_TRUE(caps.cross_process);
  EXPECT_FALSE(caps.zero_copy_send);
  EXPECT_FALSE(caps.rdma);
  EXPECT_FALSE(caps.gpu_memory);
  EXPECT_EQ(caps.max_message_bytes, GrpcOptions().grpc_max_message_bytes);
  EXPECT_EQ(caps.devices, std::vector<std::string>{"tcp"});
}

// grpc_refused_fails_fast: a closed port's refusal ends Connect at once (the producer's case: a
// registered consumer that refuses is gone). Judged by which error comes back, not by time: the
// default goes on retrying until the timeout and says so.
TEST(GrpcTransportTest, ARefusedConnectionFailsAtOnceWhereAsked) {
  std::string closed;
  {
    std::unique_ptr<Transport> server_transport = NewTransport();
    absl::StatusOr<std::unique_ptr<Listener>> listener = server_transport->Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    closed = (*listener)->address();
  }  // closed: nothing listens there now
  TransportOptions fast = GrpcOptions();
  fast.grpc_refused_fails_fast = true;
  absl::StatusOr<std::unique_ptr<Link>> refused =
      NewTransport(fast)->Connect(closed, absl::Seconds(60));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("refused or unreachable"));
  absl::StatusOr<std::unique_ptr<Link>> waited =
      NewTransport()->Connect(closed, absl::Milliseconds(300));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(waited.status().message()), HasSubstr("within"));
}

TEST(GrpcTransportTest, SeveralLinksAtOnce) {
  std::unique_ptr<Transport> server_transport = NewTransport();
  std::unique_ptr<Transport> client_transport = NewTransport();
  absl::StatusOr<std::unique_ptr<Listener>> listener = server_transport->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  constexpr int kLinks = 4;
  std::vector<std::unique_ptr<FrameRecorder>> got;  // outlives the links
  std::vector<std::unique_ptr<Link>> clients;
  std::vector<std::unique_ptr<Link>> servers;
  for (int i = 0; i < kLinks; ++i) {
    absl::StatusOr<std::unique_ptr<Link>> client =
        client_transport->Connect((*listener)->address(), absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<std::unique_ptr<Link>> server = (*listener)->Accept(absl::Seconds(5));
    ASSERT_TRUE(server.ok()) << server.status();
    clients.push_back(*std::move(client));
    servers.push_back(*std::move(server));
    got.push_back(std::make_unique<FrameRecorder>());
    servers.back()->Start(got.back().get());
  }
  const std::string bytes = PatternBytes(3 * kMiB, 11);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  std::vector<std::thread> senders;
  for (int i = 0; i < kLinks; ++i) {
    senders.emplace_back([&, i] {
      for (uint32_t c = 0; c < 8; ++c) {
        EXPECT_TRUE(clients[i]->Send(testing::ValidChunk(100 + i, c, payload)).ok());
      }
    });
  }
  for (std::thread& sender : senders) sender.join();
  for (int i = 0; i < kLinks; ++i) {
    ASSERT_TRUE(got[i]->WaitForFrames(8, absl::Seconds(10)));
    std::vector<Frame> frames = got[i]->TakeFrames();
    for (uint32_t c = 0; c < frames.size(); ++c) {
      EXPECT_EQ(frames[c].session_id, 100u + i);
      v1::TransferFrame meta;
      ASSERT_TRUE(meta.ParseFromString(frames[c].meta));
      EXPECT_EQ(meta.chunk().index(), c);
      EXPECT_TRUE(frames[c].payload.view() == bytes);
    }
  }
}

TEST(GrpcTransportTest, DestroyingTheServerTransportTakesLinksDown) {
  FrameRecorder client_got;  // outlives the links
  FrameRecorder server_got;
  LinkPair pair = Connected();
  ASSERT_NE(pair.server, nullptr);
  pair.client->Start(&client_got);
  pair.server->Start(&server_got);
  const absl::Time start = absl::Now();
  pair.listener.reset();
  pair.server_transport.reset();  // closes the accepted link it still has
  std::optional<absl::Status> local = server_got.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->code(), absl::StatusCode::kCancelled);
  std::optional<absl::Status> remote = client_got.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(remote.has_value());
  EXPECT_EQ(remote->code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(pair.server->Send(testing::ValidControl(FrameType::kAck, 1, 1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GrpcTransportTest, DestroyingTheClientTransportMidTransferIsPromptAndLeakFree) {
  {
    FrameRecorder client_got;  // outlives the links
    FrameRecorder server_got;
    LinkPair pair = Connected();
    ASSERT_NE(pair.server, nullptr);
    pair.client->Start(&client_got);
    pair.server->Start(&server_got);
    const std::string bytes = PatternBytes(4 * kMiB, 13);
    {
      const Payload payload = Payload::Copy(bytes.data(), bytes.size());
      for (uint32_t i = 0; i < 32; ++i) {
        ASSERT_TRUE(pair.client->Send(testing::ValidChunk(5, i, payload)).ok());
        ASSERT_TRUE(pair.server->Send(testing::ValidChunk(6, i, payload)).ok());
      }
    }
    const absl::Time start = absl::Now();
    pair.client_transport.reset();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    std::optional<absl::Status> local = client_got.WaitForLinkDown(absl::Seconds(1));
    ASSERT_TRUE(local.has_value());
    EXPECT_EQ(local->code(), absl::StatusCode::kCancelled);
    std::optional<absl::Status> remote = server_got.WaitForLinkDown(absl::Seconds(1));
    ASSERT_TRUE(remote.has_value());
    EXPECT_EQ(remote->code(), absl::StatusCode::kUnavailable);
    client_got.TakeFrames();
    server_got.TakeFrames();
  }
  EXPECT_EQ(SettledLiveBuffers(), 0);
}

// TCP connections in ESTABLISHED state accepted on `port` of this host (/proc/net/tcp).
int EstablishedOn(int port) {
  int n = 0;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const std::string local_port = local.substr(local.rfind(':') + 1);
      if (state == "01" && std::strtol(local_port.c_str(), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

// A link that dies on gRPC's threads buries its channel there (grpc_link.h); the reaper destroys
// it at once, so its TCP connection does not stay open until the process's next Connect (the
// soak found one such connection left on a restarted producer and its consumer after the load).
TEST(GrpcTransportTest, ABuriedChannelsConnectionClosesWithoutAnotherConnect) {
  std::unique_ptr<Transport> server_transport = NewTransport();  // starts the reaper
  absl::StatusOr<std::unique_ptr<Listener>> listener = server_transport->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string address = (*listener)->address();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, as a link's
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  ASSERT_TRUE(channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10))));
  EXPECT_EQ(EstablishedOn(port), 1);
  grpc_internal::BuryChannel(std::move(channel));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // waits: the kernel's socket table signals nothing; the reaper closes the connection within
  // milliseconds, the 10 s only bound a starved machine.
  while (EstablishedOn(port) > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(EstablishedOn(port), 0) << "the buried channel's TCP connection is still open";
}

TEST(GrpcTransportTest, KeepaliveKeepsIdleLinksAndNoticesASilentPeer) {
  FrameRecorder client_got;  // outlives the links
  FrameRecorder server_got;
  std::unique_ptr<Transport> server_transport = NewTransport();
  std::unique_ptr<Transport> client_transport = NewTransport();
  absl::StatusOr<std::unique_ptr<Listener>> listener = server_transport->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string server_address = (*listener)->address();
  int server_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(server_address.substr(server_address.rfind(':') + 1), &server_port));
  testing::FreezableProxy proxy(server_port);
  absl::StatusOr<std::unique_ptr<Link>> client =
      client_transport->Connect(proxy.address(), absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::unique_ptr<Link>> server = (*listener)->Accept(absl::Seconds(5));
  ASSERT_TRUE(server.ok()) << server.status();
  (*client)->Start(&client_got);
  (*server)->Start(&server_got);

  // Idle through several keepalive rounds: the server accepts the pings, the link stays up.
  // paces: idle through several keepalive rounds (time passing is the scenario)
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(client_got.link_down_calls(), 0);
  EXPECT_EQ(server_got.link_down_calls(), 0);
  ASSERT_TRUE((*client)->Send(testing::ValidControl(FrameType::kHeartbeat, 0, 1)).ok());
  ASSERT_TRUE(server_got.WaitForFrames(1, absl::Seconds(2)));

  // Silence: both ends give up after about keepalive interval + timeout (1 s by default).
  const absl::Time start = absl::Now();
  proxy.Freeze();
  std::optional<absl::Status> client_down = client_got.WaitForLinkDown(absl::Seconds(5));
  std::optional<absl::Status> server_down = server_got.WaitForLinkDown(absl::Seconds(5));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(client_down.has_value());
  ASSERT_TRUE(server_down.has_value());
  EXPECT_EQ(client_down->code(), absl::StatusCode::kUnavailable) << *client_down;
  EXPECT_EQ(server_down->code(), absl::StatusCode::kUnavailable) << *server_down;
  EXPECT_LT(took, absl::Seconds(3));
  spdlog::info("silent peer noticed after {} ({})", absl::FormatDuration(took),
               std::string(client_down->message()));
}

TEST(GrpcTransportTest, MalformedFramesAreRefusedBySend) {
  FrameRecorder got;  // outlives the links
  LinkPair pair = Connected();
  ASSERT_NE(pair.server, nullptr);
  pair.server->Start(&got);
  // Not a TransferFrame at all.
  EXPECT_EQ(pair.client->Send(MakeFrame(FrameType::kCredit, 1, std::string("\x07\xff", 2))).code(),
            absl::StatusCode::kInvalidArgument);
  // An empty TransferFrame has no body.
  EXPECT_EQ(pair.client->Send(MakeFrame(FrameType::kCredit, 0, "")).code(),
            absl::StatusCode::kInvalidArgument);
  // Type and meta disagree.
  Frame header = testing::ValidHeader(1, 1);
  header.type = FrameType::kAck;
  EXPECT_EQ(pair.client->Send(header).code(), absl::StatusCode::kInvalidArgument);
  // Session and meta disagree.
  header = testing::ValidHeader(1, 1);
  header.session_id = 2;
  EXPECT_EQ(pair.client->Send(header).code(), absl::StatusCode::kInvalidArgument);
  // payload_bytes and the payload disagree.
  Frame chunk = testing::ValidChunk(1, 0, Payload::Copy("abcd", 4));
  chunk.meta = ChunkFrameMeta(1, 0, 5).SerializeAsString();
  EXPECT_EQ(pair.client->Send(chunk).code(), absl::StatusCode::kInvalidArgument);
  // The link still works.
  ASSERT_TRUE(pair.client->Send(testing::ValidChunk(1, 0, Payload::Copy("abcd", 4))).ok());
  ASSERT_TRUE(got.WaitForFrames(1, absl::Seconds(5)));
  EXPECT_EQ(got.TakeFrames()[0].payload.view(), "abcd");
  EXPECT_EQ(got.link_down_calls(), 0);
}

// A peer using the generated protobuf stub: the hand-made chunk/piece encoding interoperates with
// protobuf in both directions.
TEST(GrpcTransportTest, InteroperatesWithAPlainProtobufPeer) {
  FrameRecorder got;  // outlives the links
  std::unique_ptr<Transport> transport = NewTransport();
  absl::StatusOr<std::unique_ptr<Listener>> listener = transport->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto stub = v1::Transfer::NewStub(
      grpc::CreateChannel((*listener)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Transfer(&context);
  absl::StatusOr<std::unique_ptr<Link>> link = (*listener)->Accept(absl::Seconds(5));
  ASSERT_TRUE(link.ok()) << link.status();
  (*link)->Start(&got);

  // protobuf -> link: payload field before payload_bytes, as protobuf orders them.
  v1::TransferFrame first = ChunkFrameMeta(5, 1, 11);
  first.mutable_chunk()->set_payload("hello ");
  ASSERT_TRUE(stream->Write(first));
  v1::TransferFrame piece;
  piece.set_session_id(5);
  piece.mutable_piece()->set_data("world");
  piece.mutable_piece()->set_last(true);
  ASSERT_TRUE(stream->Write(piece));
  ASSERT_TRUE(got.WaitForFrames(1, absl::Seconds(5)));
  std::vector<Frame> frames = got.TakeFrames();
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].type, FrameType::kChunk);
  EXPECT_EQ(frames[0].session_id, 5u);
  EXPECT_EQ(frames[0].payload.view(), "hello world");
  v1::TransferFrame meta;
  ASSERT_TRUE(meta.ParseFromString(frames[0].meta));
  EXPECT_TRUE(meta.chunk().payload().empty());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(meta, ChunkFrameMeta(5, 1, 11)));

  // link -> protobuf: a 2.5 MiB chunk arrives as a chunk with 1 MiB and two pieces.
  const std::string bytes = PatternBytes(5 * kMiB / 2, 9);
  ASSERT_TRUE(
      (*link)->Send(testing::ValidChunk(6, 2, Payload::Copy(bytes.data(), bytes.size()))).ok());
  v1::TransferFrame in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_chunk());
  EXPECT_EQ(in.session_id(), 6u);
  EXPECT_EQ(in.chunk().payload_bytes(), bytes.size());
  std::string assembled = in.chunk().payload();
  EXPECT_EQ(assembled.size(), kMiB);
  int pieces = 0;
  while (assembled.size() < bytes.size()) {
    ASSERT_TRUE(stream->Read(&in));
    ASSERT_TRUE(in.has_piece());
    EXPECT_EQ(in.session_id(), 6u);
    assembled += in.piece().data();
    EXPECT_EQ(in.piece().last(), assembled.size() == bytes.size());
    ++pieces;
  }
  EXPECT_EQ(pieces, 2);
  EXPECT_TRUE(assembled == bytes);

  // Half-closing the protobuf stream is the peer closing the link.
  stream->WritesDone();
  std::optional<absl::Status> down = got.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(down.has_value());
  EXPECT_EQ(down->code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(stream->Finish().ok());
}

// A peer breaking the piece protocol takes the link down with DataLoss.
void CheckMalformedStream(const std::vector<v1::TransferFrame>& messages, absl::string_view what) {
  FrameRecorder got;  // outlives the links
  std::unique_ptr<Transport> transport = NewTransport();
  absl::StatusOr<std::unique_ptr<Listener>> listener = transport->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  auto stub = v1::Transfer::NewStub(
      grpc::CreateChannel((*listener)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->Transfer(&context);
  absl::StatusOr<std::unique_ptr<Link>> link = (*listener)->Accept(absl::Seconds(5));
  ASSERT_TRUE(link.ok()) << link.status();
  (*link)->Start(&got);
  for (const v1::TransferFrame& message : messages) stream->Write(message);
  std::optional<absl::Status> down = got.WaitForLinkDown(absl::Seconds(2));
  ASSERT_TRUE(down.has_value()) << what;
  EXPECT_EQ(down->code(), absl::StatusCode::kDataLoss) << *down;
  EXPECT_NE(down->message().find(what), absl::string_view::npos) << *down;
  EXPECT_EQ(got.frame_count(), 0u);
  v1::TransferFrame ignored;
  while (stream->Read(&ignored)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_EQ(got.link_down_calls(), 1);
}

TEST(GrpcTransportTest, PieceWithoutChunkTakesLinkDown) {
  v1::TransferFrame piece;
  piece.set_session_id(1);
  piece.mutable_piece()->set_data("xyz");
  piece.mutable_piece()->set_last(true);
  CheckMalformedStream({piece}, "piece without a chunk");
}

TEST(GrpcTransportTest, PieceSizeMismatchTakesLinkDown) {
  v1::TransferFrame chunk = ChunkFrameMeta(1, 0, 10);
  chunk.mutable_chunk()->set_payload("abc");
  v1::TransferFrame piece;
  piece.set_session_id(1);
  piece.mutable_piece()->set_data("defg");
  piece.mutable_piece()->set_last(true);
  CheckMalformedStream({chunk, piece}, "size mismatch");
}

TEST(GrpcTransportTest, DataFrameInsideAChunkTakesLinkDown) {
  v1::TransferFrame chunk = ChunkFrameMeta(1, 0, 10);
  chunk.mutable_chunk()->set_payload("abc");
  v1::TransferFrame trailer;
  trailer.set_session_id(1);
  trailer.mutable_trailer()->set_chunk_count(1);
  CheckMalformedStream({chunk, trailer}, "while a chunk still expects 7 bytes");
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

struct Bandwidth {
  double mb_per_s = 0;      // goodput, 10^6 bytes per second
  double cpu_s_per_gb = 0;  // both ends' CPU time (this process) per 10^9 bytes
};

// Streams `count` chunks of `chunk_bytes` one way.
Bandwidth MeasureBandwidth(size_t piece_bytes, size_t chunk_bytes, size_t count) {
  CountingHandler counter;  // outlives the links
  TransportOptions options = GrpcOptions();
  options.grpc_max_message_bytes = piece_bytes;
  LinkPair pair = Connected(options);
  if (pair.server == nullptr) return {};
  pair.server->Start(&counter);
  const std::string bytes = PatternBytes(chunk_bytes, 1);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  // Warm-up: the first chunks fault in the receive buffers that the rest reuse.
  for (uint32_t i = 0; i < 4; ++i)
    EXPECT_TRUE(pair.client->Send(testing::ValidChunk(1, i, payload)).ok());
  EXPECT_TRUE(counter.WaitForFrames(4, absl::Seconds(30)));
  const absl::Time start = absl::Now();
  const double cpu_start = CpuSeconds();
  for (uint32_t i = 0; i < count; ++i) {
    EXPECT_TRUE(pair.client->Send(testing::ValidChunk(1, i, payload)).ok());
  }
  EXPECT_TRUE(counter.WaitForFrames(4 + count, absl::Seconds(60)));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double bytes_sent = static_cast<double>(chunk_bytes * count);
  return {bytes_sent / seconds / 1e6, (CpuSeconds() - cpu_start) / bytes_sent * 1e9};
}

TEST(GrpcTransportTest, BandwidthOf4MiBChunks) {
  const Bandwidth bw = MeasureBandwidth(GrpcOptions().grpc_max_message_bytes, 4 * kMiB, 128);
  spdlog::info(
      "grpc loopback goodput, 4 MiB chunks in {} KiB messages: {:.0f} MB/s ({:.2f} CPU s/GB)",
      GrpcOptions().grpc_max_message_bytes / 1024, bw.mb_per_s, bw.cpu_s_per_gb);
  EXPECT_GT(bw.mb_per_s, 0);
}

// Manual sweep of message (piece) and chunk sizes:
//   grpc_transport_test --gtest_also_run_disabled_tests --gtest_filter=*Sweep*
// SWEEP_PIECE_KIB / SWEEP_CHUNK_KIB in the environment pin one of them.
TEST(GrpcTransportTest, DISABLED_BandwidthSweep) {
  std::vector<size_t> pieces = {kMiB / 4, kMiB, 4 * kMiB, 16 * kMiB};
  std::vector<size_t> chunks = {kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
  size_t kib = 0;
  const char* env = std::getenv("SWEEP_PIECE_KIB");
  if (env != nullptr && absl::SimpleAtoi(env, &kib) && kib > 0) pieces = {kib * 1024};
  env = std::getenv("SWEEP_CHUNK_KIB");
  if (env != nullptr && absl::SimpleAtoi(env, &kib) && kib > 0) chunks = {kib * 1024};
  for (size_t piece : pieces) {
    for (size_t chunk : chunks) {
      const size_t count = std::max<size_t>(8, 512 * kMiB / chunk);
      const Bandwidth bw = MeasureBandwidth(piece, chunk, count);
      spdlog::info("piece {:>6} KiB  chunk {:>6} KiB  {:>6.0f} MB/s  {:.2f} CPU s/GB", piece / 1024,
                   chunk / 1024, bw.mb_per_s, bw.cpu_s_per_gb);
    }
  }
}

}  // namespace
}  // namespace scd::transport
