// The UCX backend's core: one ucp context and worker per Transport, and ONE progress thread that
// makes every ucp call (the worker is created UCS_THREAD_MODE_SINGLE, so ucp takes no locks).
// Other threads hand work over through a mutex-protected command queue (Listen, Connect, Start,
// Close) or a per-link inbox (Send) and wake the worker with ucp_worker_signal.
//
// Its parts live in one file each:
//   ucx_progress.cc   the context, the worker, the registered receive pool, the progress loop and
//                     shutdown (spin while busy, sleep on the worker's event fd when idle)
//   ucx_handshake.cc  listening and connecting (hello / hello-ack), closing (bye / bye-ack),
//                     endpoint errors
//   ucx_data_path.cc  frames as active messages: the send window, eager and rendezvous receives,
//                     in-order delivery through each link's DeliveryGate
//
// Delivery: LinkHandlers are called on the progress thread, outside any ucp callback (callbacks
// only record what arrived; the loop delivers after ucp_worker_progress returns). So a handler may
// call Send, Start and Close (even on its own link) but must not block, and must not call
// Connect/Listen/Accept or destroy the Transport.
// Thread-safety: the public methods are thread-safe; the rest runs on the progress thread.
#ifndef SCD_TRANSPORT_UCX_UCX_CORE_H_
#define SCD_TRANSPORT_UCX_UCX_CORE_H_

#include <ucp/api/ucp.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/receive_pool.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_link_state.h"

namespace scd::transport::ucx_internal {

// Send window per link (data lane). At least one frame is always allowed, so a frame larger than
// the byte budget still goes. Measured here (1..64 MiB frames, tcp and shared memory): 8 frames
// hide the per-frame rendezvous round trip; more only cycles more distinct receive buffers through
// the caches (and through the pool cap), which was slower.
constexpr int kMaxDataFramesInFlight = 8;
constexpr size_t kMaxDataBytesInFlight = size_t{256} << 20;
// How long a closing side waits for the peer's bye-ack (and the peer for its ack to leave) before
// force-closing the endpoint. Closing earlier can lose the bye: over TCP, closing a socket with
// unread input sends a reset that may overtake it.
constexpr absl::Duration kByeBound = absl::Milliseconds(500);
constexpr absl::Duration kHandshakeBound = absl::Seconds(10);
constexpr absl::Duration kCommandBound = absl::Seconds(5);
constexpr absl::Duration kShutdownBound = absl::Seconds(2);
constexpr int kIdlePollMs = 100;
// After the last event, how long the progress thread keeps polling before it sleeps on the event
// fd (while transfers are in flight). Short: on 2 cores a thread spinning on a cma rendezvous the
// peer pulls, or on a socket with nothing to read, takes the core the peer's copy or the CRC needs
// (bench/README.md: 2 ms of spin cost 20-30 % of session goodput; 50 us kept latency and more).
constexpr absl::Duration kSpinWindow = absl::Microseconds(50);
constexpr int kTimerPollMs = 10;
// A reorder window this far ahead of the next expected data frame means a broken peer.
constexpr uint64_t kMaxReorderWindow = uint64_t{1} << 20;

class Core {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> Create(const TransportOptions& options);
  ~Core() { Shutdown(); }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  const Capabilities& capabilities() const { return capabilities_; }

  // User-thread API.
  absl::StatusOr<std::shared_ptr<ListenerState>> Listen(const std::string& address);
  absl::StatusOr<std::shared_ptr<LinkState>> Connect(const std::string& address,
                                                     absl::Duration timeout);
  void CloseListener(const std::shared_ptr<ListenerState>& listener);
  void Start(const std::shared_ptr<LinkState>& link, LinkHandler* handler);
  absl::Status Send(const std::shared_ptr<LinkState>& link, Frame frame);
  // Drops the session's data frames not yet posted to ucp (Link::DropSession).
  void DropSession(const std::shared_ptr<LinkState>& link, uint64_t session_id);
  void CloseLink(const std::shared_ptr<LinkState>& link);
  // Closes everything, joins the progress thread and releases every ucp resource (bounded).
  void Shutdown();

 private:
  // A Close the progress thread could not run within kCommandBound (or at all: shutting down):
  // the handler's OnLinkDown on the calling thread, so none comes after Close returns.
  void TellHandlerHere(const std::shared_ptr<LinkState>& link);
  explicit Core(const TransportOptions& options) : options_(options) {}

  absl::Status Init();
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_; }
  // Queues `fn` for the progress thread; false once the core stopped.
  bool Post(std::function<void()> fn);
  // Runs `fn` on the progress thread (inline when already there) and waits up to `bound`; false if
  // it did not run in time. `fn` must capture by value: it may run after a timed-out wait.
  bool RunAndWait(std::function<void()> fn, absl::Duration bound);

  // Progress thread.
  void Loop();
  bool TakeCommands();
  void Idle();
  void BeginShutdown();
  bool Quiescent() const;
  void ProcessConnRequests();
  void ProcessHellos();
  void ProcessHelloAcks();
  // "ucx <remote> (posix,cma)": the transports of the endpoint's lanes.
  std::string DescribeEndpoint(const LinkState& link);
  void ProcessPumps();
  // Before the worker goes: progress until ucp has nothing deferred left (bounded).
  void DrainWorker();
  // Posts the link's queued frames: control frames at once, data frames within the send window.
  void Pump(const std::shared_ptr<LinkState>& link);
  void DeliverAll();
  // Hands the link's arrived frames, then its end, to its DeliveryGate (outside ucp callbacks).
  void Deliver(const std::shared_ptr<LinkState>& link);
  void ProcessClosing(absl::Time now);
  void CloseEndpoint(const std::shared_ptr<LinkState>& link);
  void CheckHandshakes(absl::Time now);
  void CloseListenerNow(const std::shared_ptr<ListenerState>& listener);
  // Marks `link` down: no more sends, queued frames released, OnLinkDown scheduled and the
  // endpoint's teardown scheduled. `bye`: this side closes it (the peer is told; frames that
  // arrived but were not delivered are dropped); otherwise the peer or the network ended it (what
  // arrived before is still delivered). Makes no ucp call unless `bye` (so it is safe inside ucp
  // callbacks with bye = false).
  void LinkDown(const std::shared_ptr<LinkState>& link, absl::Status status, bool bye);
  void ScheduleDeliver(const std::shared_ptr<LinkState>& link);
  void SchedulePump(const std::shared_ptr<LinkState>& link);
  // Posts one AM on `link`; `frame` is the frame (kFrame) or empty.
  void PostAm(const std::shared_ptr<LinkState>& link, WireKind kind, Frame frame, bool data);
  void SendDone(SendOp* op, ucs_status_t status);
  ucs_status_t HandleAm(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);
  // HandleAm's for a kFrame message: checks it (a malformed one ends the link), then receives it
  // as a rendezvous (into a pooled buffer) or from ucp's eager buffer.
  void HandleFrameAm(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                     const char* inline_meta, size_t inline_meta_len, void* data, size_t length,
                     const ucp_am_recv_param_t* param);
  void ReceiveRendezvous(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                         const char* inline_meta, void* data, size_t length);
  void ReceiveEager(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                    const char* inline_meta, const void* data, size_t length);
  void RecvDone(RecvOp* op, ucs_status_t status);
  void Accept(const std::shared_ptr<LinkState>& link, bool control, uint64_t seq, Frame frame);
  void HandleEpError(ucp_ep_h ep, ucs_status_t status);
  // Endpoint parameters every link has: peer error mode with this core's error handler.
  ucp_ep_params_t PeerErrorEndpoint();
  SendOp* NewSendOp();
  void FreeSendOp(SendOp* op);
  RecvOp* NewRecvOp();
  void FreeRecvOp(RecvOp* op);

  static void OnSendComplete(void* request, ucs_status_t status, void* user_data);
  static void OnRecvComplete(void* request, ucs_status_t status, size_t length, void* user_data);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnConnRequest(ucp_conn_request_h request, void* arg);

  const TransportOptions options_;
  Capabilities capabilities_;
  std::string devices_text_;  // "tcp" / "posix,cma,self", for Describe
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  size_t max_inline_meta_ = 0;
  std::shared_ptr<ReceivePool> pool_;  // registered with ucp_mem_map (ucx_progress.cc)
  std::thread thread_;
  std::thread::id thread_id_;

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // no more commands; the thread is winding down
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<LinkState>> ready_links_ ABSL_GUARDED_BY(mu_);
  absl::Mutex shutdown_mu_;  // serializes Shutdown callers
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  // Progress thread only (and the destructor after the thread joined).
  bool stopping_ = false;
  std::unordered_map<ucp_ep_h, std::shared_ptr<LinkState>> eps_;
  std::vector<std::shared_ptr<ListenerState>> listeners_;
  std::vector<std::pair<ListenerState*, ucp_conn_request_h>> conn_requests_;
  std::vector<std::shared_ptr<LinkState>> hellos_;
  std::vector<std::shared_ptr<LinkState>> hello_acks_;
  std::vector<std::shared_ptr<LinkState>> handshaking_;
  LinkWorkList<&LinkState::on_deliver_list> deliver_list_;
  LinkWorkList<&LinkState::on_pump_list> pump_list_;
  struct Closing {
    std::shared_ptr<LinkState> link;
    absl::Time close_at;
  };
  std::vector<Closing> closing_;
  std::vector<void*> close_requests_;
  OpPool<SendOp> send_ops_;
  OpPool<RecvOp> recv_ops_;
  int send_ops_in_flight_ = 0;
  int recv_ops_in_flight_ = 0;
  absl::Time next_handshake_check_ = absl::InfinitePast();
  absl::Time last_event_ = absl::InfinitePast();
};

}  // namespace scd::transport::ucx_internal

#endif  // SCD_TRANSPORT_UCX_UCX_CORE_H_
