// Transport: the one interface every backend (in-process, gRPC, UCX) implements. It moves Frames
// (transport/frame.h) over Links and knows nothing about models or codecs; sessions, credits,
// heartbeats and deadlines live one level up, in TransferConnection (transfer_session.h), so every
// backend gets them the same way.
//
//   receiving side:  Listen(address) -> Listener::Accept() -> Link
//   sending side:    Connect(address) -> Link
//
// A Link is bidirectional. Link::Send never blocks on the network: it queues the frame and
// returns. Data frames (header/chunk/trailer) are delivered to the peer's LinkHandler in the order
// they were sent; control frames never queue behind data frames (they may overtake them). When the
// link fails or either side closes it, the handler gets exactly one OnLinkDown and no OnFrame
// after it, and every queued payload is released. tests/link_contract_test.cc holds every backend
// to this; the mechanisms every backend shares: lane_queue.h (the two lanes, DropSession),
// delivery_gate.h (Start, one OnLinkDown, no exception escaping), receive_pool.h, link_wrapper.h.
//
// Thread-safety: Transport, Listener and Link methods are thread-safe. A LinkHandler is called
// from one backend thread at a time per link and must not block for long (it queues work). It may
// Send on and Close its own link from inside a call; OnLinkDown then comes after that call
// returns, on the same thread.
#ifndef SCD_TRANSPORT_TRANSPORT_H_
#define SCD_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/frame.h"

namespace scd::transport {

struct LinkShape;  // link_shaper.h

// What a backend can do; callers pick behaviour from this, never from the backend's name.
struct Capabilities {
  std::string backend;               // "inproc", "grpc", "ucx"
  bool cross_process = false;        // peers may live in other processes / hosts
  bool zero_copy_send = false;       // the sender's payload bytes are not copied by the transport
  bool rdma = false;                 // one-sided remote memory access is available (UCX with RDMA)
  bool gpu_memory = false;           // payloads may point into GPU memory
  size_t max_message_bytes = 0;      // the backend splits larger payloads itself; 0 = no limit
  std::vector<std::string> devices;  // e.g. UCX transports in use ("tcp", "posix", "cma", ...)
};

class LinkHandler {
 public:
  virtual ~LinkHandler() = default;
  virtual void OnFrame(Frame frame) = 0;
  // Once per link; `status` says why (Cancelled when this side closed it, Unavailable when the
  // peer closed it or the connection failed).
  virtual void OnLinkDown(absl::Status status) = 0;
};

class Link {
 public:
  virtual ~Link() = default;  // closes the link (handler gets OnLinkDown first if started)
  // Starts delivery to `handler`, which must outlive the link. Frames that arrived before Start
  // are held and delivered after it.
  virtual void Start(LinkHandler* handler) = 0;
  // Queues `frame`. FailedPrecondition once the link is down.
  virtual absl::Status Send(Frame frame) = 0;
  // Closes the link (idempotent); this side's handler has heard OnLinkDown(Cancelled) when it
  // returns (unless called from inside that handler). The peer sees OnLinkDown(Unavailable).
  virtual void Close() = 0;
  // Session `session_id` ended early (cancelled, failed): its chunks and trailer still queued here
  // and not yet handed to the wire are dropped, releasing their payloads. Its header and every
  // control frame still go (the peer learns of the session, then of its end). Decorators pass the
  // call on to the link they wrap (LinkWrapper); a backend with nothing queued ignores it.
  virtual void DropSession(uint64_t /*session_id*/) {}
  // The link's shape from now on, for what it still holds too: a shaped link (link_shaper.h)
  // re-times the data frames its bucket has not yet released at the new rate, as a real link's
  // rate drop slows a transfer already under way. Decorators pass the call on (LinkWrapper);
  // UNIMPLEMENTED for a link that is not shaped.
  virtual absl::Status Reshape(const LinkShape& /*shape*/) {
    return absl::UnimplementedError("the link is not shaped");
  }
  // "ucx 127.0.0.1:40123 (tcp)" and the like, for logs.
  virtual std::string Describe() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits up to `timeout` for the next incoming link. DeadlineExceeded on timeout, Cancelled
  // after Close.
  virtual absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) = 0;
  // The address peers connect to, with the actual port when Listen was given port 0.
  virtual std::string address() const = 0;
  virtual void Close() = 0;
};

struct TransportOptions {
  std::string backend = "inproc";  // "inproc" | "grpc" | "ucx"
  // gRPC: payloads above this travel as several messages (below gRPC's 4 MiB default limit).
  size_t grpc_max_message_bytes = size_t{1} << 20;
  // gRPC keepalive: pings this often on an idle connection; a peer silent for the timeout is dead.
  absl::Duration grpc_keepalive_interval = absl::Milliseconds(250);
  absl::Duration grpc_keepalive_timeout = absl::Milliseconds(750);
  // UCX: payloads at or above this go by rendezvous (zero-copy); below, eagerly.
  size_t ucx_rendezvous_threshold = size_t{64} << 10;
  // UCX: endpoint keepalive (peer-failure detection below the application heartbeat).
  absl::Duration ucx_keepalive_interval = absl::Milliseconds(250);
  // gRPC: Connect to an address that refuses the connection fails at once (UNAVAILABLE) instead
  // of retrying until its timeout. A producer connects only to registered consumers, which listen
  // before they register: a refusal means the consumer is gone, and waiting would hold the
  // producer's prefill for the whole timeout. Off: a listener that comes up during the timeout
  // is found.
  bool grpc_refused_fails_fast = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const Capabilities& capabilities() const = 0;
  // `address` is "host:port" (port 0 picks a free one) for grpc/ucx, any name for inproc.
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) = 0;
  virtual absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                        absl::Duration timeout) = 0;
};

// The backends this build has ("inproc", "grpc", "ucx").
std::vector<std::string> AvailableBackends();
// InvalidArgument for an unknown backend name, Unimplemented for one this build lacks.
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_TRANSPORT_H_
