#include "tests/transport_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/frame_message.h"
#include "transport/session_acceptor.h"

namespace scd::testing {

void FrameRecorder::OnFrame(transport::Frame frame) {
  absl::MutexLock lock(&mu_);
  frames_.push_back(std::move(frame));
}

void FrameRecorder::OnLinkDown(absl::Status status) {
  absl::MutexLock lock(&mu_);
  ++down_calls_;
  if (!down_) down_ = std::move(status);
}

bool FrameRecorder::WaitForFrames(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool FrameRecorder::WaitForSession(uint64_t session, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::any_of(frames_.begin(), frames_.end(),
                       [session](const transport::Frame& f) { return f.session_id == session; });
  };
  return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
}

std::optional<absl::Status> FrameRecorder::WaitForLinkDown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto down = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return down_.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&down), timeout);
  return down_;
}

std::vector<transport::Frame> FrameRecorder::TakeFrames() {
  absl::MutexLock lock(&mu_);
  std::vector<transport::Frame> out;
  out.swap(frames_);
  return out;
}

size_t FrameRecorder::frame_count() {
  absl::MutexLock lock(&mu_);
  return frames_.size();
}

int FrameRecorder::link_down_calls() {
  absl::MutexLock lock(&mu_);
  return down_calls_;
}

transport::Frame MakeFrame(transport::FrameType type, uint64_t session, std::string meta,
                           const std::string& bytes) {
  transport::Frame frame;
  frame.type = type;
  frame.session_id = session;
  frame.meta = std::move(meta);
  if (!bytes.empty()) frame.payload = transport::Payload::Copy(bytes.data(), bytes.size());
  return frame;
}

std::string PatternBytes(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

transport::Frame ValidHeader(uint64_t session, uint64_t chunks, size_t id_bytes) {
  v1::TransferFrame frame;
  frame.set_session_id(session);
  v1::TransferHeader* header = frame.mutable_header();
  header->set_protocol_major(1);
  std::string id = absl::StrCat("req-", session, "-");
  id.resize(std::max(id.size(), id_bytes), static_cast<char>('a' + session % 26));
  header->set_request_id(id);
  header->set_mode(v1::MODE_SCD);
  header->set_tokens(4096);
  header->set_expected_chunks(chunks);
  v1::LayerPlan* plan = header->add_layer_plan();
  plan->set_layer(3);
  plan->set_rank_k(64);
  return *transport::FrameFromMessage(frame);
}

transport::Frame ValidChunk(uint64_t session, uint32_t index, transport::Payload payload) {
  v1::TransferFrame frame;
  frame.set_session_id(session);
  v1::CodeChunk* chunk = frame.mutable_chunk();
  chunk->set_index(index);
  chunk->set_layer(index % 7);
  chunk->set_kind(v1::KIND_VALUE_CODE);
  chunk->set_token_begin(index * 16);
  chunk->set_token_end(index * 16 + 16);
  chunk->set_dtype(v1::DTYPE_INT8);
  chunk->add_shape(16);
  chunk->add_shape(static_cast<int64_t>(payload.size() / 16));
  chunk->set_payload_bytes(payload.size());
  chunk->set_scales(std::string(32, static_cast<char>(index)));
  chunk->set_crc32c(0x12345678u + index);
  return *transport::FrameFromMessage(frame, std::move(payload));
}

transport::Frame ValidTrailer(uint64_t session, uint64_t chunks, uint64_t bytes) {
  v1::TransferFrame frame;
  frame.set_session_id(session);
  frame.mutable_trailer()->set_chunk_count(chunks);
  frame.mutable_trailer()->set_byte_count(bytes);
  return *transport::FrameFromMessage(frame);
}

transport::Frame ValidControl(transport::FrameType type, uint64_t session, uint64_t value) {
  v1::TransferFrame frame;
  frame.set_session_id(session);
  switch (type) {
    case transport::FrameType::kAck:
      frame.mutable_ack()->set_byte_count(value);
      break;
    case transport::FrameType::kError:
      frame.mutable_error()->set_code(v1::ERROR_PROTOCOL);
      frame.mutable_error()->set_message(absl::StrCat("error ", value));
      break;
    case transport::FrameType::kCredit:
      frame.mutable_credit()->set_bytes(value);
      break;
    case transport::FrameType::kCancel:
      frame.mutable_cancel()->set_reason(v1::ERROR_CANCELLED);
      frame.mutable_cancel()->set_message(absl::StrCat("cancel ", value));
      break;
    default:
      frame.mutable_heartbeat()->set_sent_unix_us(value);
      break;
  }
  return *transport::FrameFromMessage(frame);
}

FrameScript MakeFrameScript(uint32_t seed) {
  constexpr size_t kMiB = size_t{1} << 20;
  static const size_t kSizes[] = {0,    1,  1000,         65535,  65536, 65537,   kMiB - 1,
                                  kMiB, 17, 5 * kMiB / 2, 300000, 4096,  kMiB + 1};
  FrameScript script;
  uint32_t chunk_counter = 0;
  for (uint64_t session = 1; session <= 4; ++session) {
    const uint64_t sid = seed * 100 + session;
    script.data.push_back(ValidHeader(sid, 48, session == 2 ? 20000 : 8));
    script.payloads.emplace_back();
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < 48; ++i, ++chunk_counter) {
      const size_t size = i == 7 ? 8 * kMiB : kSizes[chunk_counter % std::size(kSizes)];
      std::string payload = PatternBytes(size, seed * 10000 + chunk_counter);
      script.data.push_back(
          ValidChunk(sid, i, transport::Payload::Copy(payload.data(), payload.size())));
      script.payloads.push_back(std::move(payload));
      bytes += size;
    }
    script.data.push_back(ValidTrailer(sid, 48, bytes));
    script.payloads.emplace_back();
  }
  static const transport::FrameType kControl[] = {
      transport::FrameType::kCredit, transport::FrameType::kHeartbeat, transport::FrameType::kAck,
      transport::FrameType::kCancel, transport::FrameType::kError};
  for (uint32_t i = 0; i < 40; ++i) {
    script.control.push_back(
        ValidControl(kControl[i % 5], seed * 100 + 1 + i % 4, seed * 1000 + i));
  }
  return script;
}

void SendFrameScript(transport::Link* link, const FrameScript& script) {
  for (size_t i = 0; i < script.data.size(); ++i) {
    ASSERT_TRUE(link->Send(script.data[i]).ok());
    if (i % 5 == 4 && i / 5 < script.control.size()) {
      ASSERT_TRUE(link->Send(script.control[i / 5]).ok());
    }
  }
}

void CheckFrameScript(std::vector<transport::Frame> got, const FrameScript& script) {
  std::vector<transport::Frame> data;
  std::multiset<std::tuple<int, uint64_t, std::string>> control;
  for (transport::Frame& frame : got) {
    if (transport::IsControl(frame.type)) {
      EXPECT_TRUE(frame.payload.empty());
      control.emplace(static_cast<int>(frame.type), frame.session_id, frame.meta);
    } else {
      data.push_back(std::move(frame));
    }
  }
  std::multiset<std::tuple<int, uint64_t, std::string>> sent_control;
  for (const transport::Frame& frame : script.control) {
    sent_control.emplace(static_cast<int>(frame.type), frame.session_id, frame.meta);
  }
  EXPECT_EQ(control, sent_control);
  ASSERT_EQ(data.size(), script.data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const transport::Frame& want = script.data[i];
    const transport::Frame& have = data[i];
    ASSERT_EQ(have.type, want.type) << "data frame " << i;
    EXPECT_EQ(have.session_id, want.session_id) << "data frame " << i;
    v1::TransferFrame want_meta, have_meta;
    ASSERT_TRUE(want_meta.ParseFromString(want.meta));
    ASSERT_TRUE(have_meta.ParseFromString(have.meta)) << "data frame " << i;
    EXPECT_EQ(have_meta.SerializeAsString(), want_meta.SerializeAsString())
        << "data frame " << i << ": " << have_meta.ShortDebugString();
    ASSERT_EQ(have.payload.size(), script.payloads[i].size()) << "data frame " << i;
    EXPECT_TRUE(have.payload.view() == script.payloads[i]) << "data frame " << i << " bytes";
  }
}

int64_t SettledLiveBuffers() {
  transport::AwaitLiveTransportBuffers(0, absl::Now() + absl::Seconds(2));
  return transport::LiveTransportBuffers();
}

WatchedBytes::WatchedBytes(std::string bytes)
    : bytes_(std::make_shared<std::string>(std::move(bytes))),
      released_(std::make_shared<absl::Notification>()),
      view_(transport::Payload::Adopt(
          reinterpret_cast<const uint8_t*>(bytes_->data()), bytes_->size(),
          [keep = bytes_, released = released_] { released->Notify(); })) {}

bool WatchedBytes::AwaitReleased(absl::Duration timeout) {
  view_.Reset();
  return released_->WaitForNotificationWithTimeout(timeout);
}

SessionPeers ConnectSessions(const std::string& backend,
                             transport::ConnectionOptions receiver_options,
                             transport::ConnectionOptions sender_options,
                             transport::FaultPolicy policy) {
  SessionPeers peers;
  transport::TransportOptions options;
  options.backend = backend;
  auto transport = transport::CreateTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  if (!transport.ok()) return peers;
  peers.transport = *std::move(transport);
  auto listener = peers.transport->Listen(backend == "inproc" ? "test:0" : "127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return peers;
  const std::string address = (*listener)->address();
  peers.acceptor =
      std::make_unique<transport::SessionAcceptor>(*std::move(listener), receiver_options);
  auto link = peers.transport->Connect(address, absl::Seconds(5));
  EXPECT_TRUE(link.ok()) << link.status();
  if (!link.ok()) return peers;
  auto faulty =
      std::make_unique<transport::FaultInjectingLink>(*std::move(link), std::move(policy));
  peers.sender_faults = faulty.get();
  peers.sender = transport::TransferConnection::Create(std::move(faulty), sender_options);
  return peers;
}

}  // namespace scd::testing
