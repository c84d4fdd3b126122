// The UCX backend's state of links, listeners and operations in flight, and its wire header.
//
// Wire format: every AM carries a WireHeader (kind, frame type, session id, per-link data sequence
// number) followed by the frame's meta bytes; the AM data is the payload. Meta too large for an AM
// header (about 8 KiB) travels in front of the payload in the AM data instead (one copy; rare).
// Both ends are assumed to share byte order.
// Thread-safety: the members under `mu` are shared with user threads; everything else belongs to
// the progress thread (ucx_core.h).
#ifndef SCD_TRANSPORT_UCX_UCX_LINK_STATE_H_
#define SCD_TRANSPORT_UCX_UCX_LINK_STATE_H_

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/delivery_gate.h"
#include "transport/lane_queue.h"
#include "transport/receive_pool.h"

namespace scd::transport::ucx_internal {

constexpr unsigned kAmId = 7;  // one AM id for everything; WireHeader::kind tells messages apart
constexpr uint8_t kWireVersion = 1;
constexpr uint8_t kFlagMetaInData = 1;
constexpr uint64_t kHelloMagic = 0x5CD0'0C0D'E5CD'0001ull;

enum class WireKind : uint8_t { kFrame = 1, kHello = 2, kHelloAck = 3, kBye = 4, kByeAck = 5 };

// Fixed part of every AM header; the frame's meta bytes follow (unless kFlagMetaInData).
struct WireHeader {
  uint8_t kind;
  uint8_t version;
  uint8_t frame_type;
  uint8_t flags;
  uint32_t meta_len;
  uint64_t session_id;
  uint64_t seq;  // data frames: per-link sequence number; hello: kHelloMagic
};
static_assert(sizeof(WireHeader) == 24, "the wire layout is fixed");

struct ListenerState;

// One endpoint's state. Shared by the user's Link, the progress thread's endpoint table and every
// operation in flight on it, so callbacks never see a dangling link.
struct LinkState {
  enum class Phase { kConnecting, kHandshaking, kUp, kDown };
  struct RecvSlot {
    bool ready = false;
    Frame frame;
  };

  LinkState(bool client_side, std::string remote_address)
      : client(client_side),
        remote(std::move(remote_address)),
        gate(std::make_unique<DeliveryGate>("ucx " + remote)) {}

  const bool client;
  const std::string remote;
  std::string description;  // written before the link is published to a user thread
  // Hands arrived frames and the link's end to the handler (held until Start, one link-down).
  const std::unique_ptr<DeliveryGate> gate;

  // Shared with user threads.
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;     // Send accepts frames
  bool queued ABSL_GUARDED_BY(mu) = false;  // on Core::ready_links_
  bool close_called ABSL_GUARDED_BY(mu) = false;
  bool start_called ABSL_GUARDED_BY(mu) = false;
  LinkHandler* handler ABSL_GUARDED_BY(mu) =
      nullptr;                                    // Start's, for a Close on the caller's thread
  LaneQueue<Frame> inbox ABSL_GUARDED_BY(mu);     // sent, not yet taken by the progress thread
  bool connect_done ABSL_GUARDED_BY(mu) = false;  // client: handshake finished or failed
  absl::Status connect_status ABSL_GUARDED_BY(mu);

  // Progress thread only.
  Phase phase = Phase::kConnecting;
  ucp_ep_h ep = nullptr;
  absl::Status down_status;
  bool closed_here = false;    // down because this side closed it (drops undelivered frames)
  bool down_reported = false;  // the gate was told
  bool on_deliver_list = false;
  bool on_pump_list = false;
  bool awaiting_bye_ack = false;  // we sent a bye; close the endpoint once the peer acks it
  bool ack_bye = false;           // the peer sent a bye; ack it before closing the endpoint
  bool ack_pending = false;       // our bye-ack is on its way
  std::deque<Frame> ready;        // arrived, in delivery order, to hand to the gate
  LaneQueue<Frame> out;           // taken from the inbox: control goes at once, data by window
  int data_in_flight = 0;
  size_t bytes_in_flight = 0;
  uint64_t next_send_seq = 0;
  uint64_t recv_base = 0;  // sequence number of reorder.front()
  std::deque<RecvSlot> reorder;
  std::shared_ptr<ListenerState> listener;  // listening side, until the hello arrived
  absl::Time handshake_deadline = absl::InfiniteFuture();
};

// Links with one kind of work due (delivery, pumping), each listed once while its flag
// `kQueued` is set. Drain runs the work on every listed link until none is due, including links
// the work itself makes due again (a handler delivering on another link, a pump after a send).
template <bool LinkState::*kQueued>
class LinkWorkList {
 public:
  void Add(const std::shared_ptr<LinkState>& link) {
    if ((*link).*kQueued) return;
    (*link).*kQueued = true;
    links_.push_back(link);
  }
  template <typename Work>
  void Drain(const Work& work) {
    while (!links_.empty()) {
      std::vector<std::shared_ptr<LinkState>> links = std::move(links_);
      links_.clear();
      for (auto& link : links) {
        (*link).*kQueued = false;
        work(link);
      }
    }
  }
  bool empty() const { return links_.empty(); }
  void clear() { links_.clear(); }

 private:
  std::vector<std::shared_ptr<LinkState>> links_;
};

class Core;

struct ListenerState {
  std::string address;  // host as given, actual port

  absl::Mutex mu;
  std::deque<std::shared_ptr<LinkState>> accepted ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  // Progress thread only.
  ucp_listener_h handle = nullptr;
  Core* core = nullptr;
};

struct SendOp {
  Core* core = nullptr;
  std::shared_ptr<LinkState> link;
  WireKind kind = WireKind::kFrame;
  bool data = false;
  bool in_flight = false;
  size_t bytes = 0;
  std::string header;  // WireHeader + meta; ucp reads it until the send completes
  Frame frame;         // keeps the payload alive until the send completes
  Payload bounce;      // meta + payload, when the meta does not fit into the AM header
};

struct RecvOp {
  Core* core = nullptr;
  std::shared_ptr<LinkState> link;
  bool in_flight = false;
  bool control = false;
  bool meta_in_data = false;
  FrameType type = FrameType::kChunk;
  uint64_t session_id = 0;
  uint64_t seq = 0;
  uint32_t meta_len = 0;
  size_t length = 0;
  std::string meta;
  ReceivePool::Buffer* buffer = nullptr;  // registered pool buffer, or
  Payload fallback;                       // an unregistered counted one
};

// The ops (ucp request contexts) of one kind: every op ever made is owned here (swept at
// shutdown); idle ones are reused, and after a burst the idle surplus beyond kMaxCached goes.
// Used on the progress thread only.
template <typename Op>
class OpPool {
 public:
  static constexpr size_t kMaxCached = 256;

  Op* Take(Core* core) {
    if (!idle_.empty()) {
      Op* op = idle_.back();
      idle_.pop_back();
      return op;
    }
    all_.push_back(std::make_unique<Op>());
    all_.back()->core = core;
    return all_.back().get();
  }
  // REQUIRES: `op` was reset by the caller.
  void Give(Op* op) {
    idle_.push_back(op);
    if (idle_.size() <= kMaxCached || all_.size() <= kMaxCached) return;
    Op* victim = idle_.back();  // linear search, rare
    idle_.pop_back();
    auto it = std::find_if(all_.begin(), all_.end(),
                           [victim](const auto& p) { return p.get() == victim; });
    if (it != all_.end()) {
      *it = std::move(all_.back());
      all_.pop_back();
    }
  }
  const std::vector<std::unique_ptr<Op>>& all() const { return all_; }

 private:
  std::vector<std::unique_ptr<Op>> all_;
  std::vector<Op*> idle_;
};

}  // namespace scd::transport::ucx_internal

#endif  // SCD_TRANSPORT_UCX_UCX_LINK_STATE_H_
