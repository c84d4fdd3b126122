// The UCX (ucp) backend. A Link is one ucp endpoint; frames travel as active messages (AM).
//
// Threads: one ucp context and one worker per Transport, and ONE progress thread per Transport that
// makes every ucp call (the worker is created UCS_THREAD_MODE_SINGLE, so ucp takes no locks).
// Other threads hand work over through a mutex-protected command queue (Listen, Connect, Start,
// Close) or a per-link inbox (Send) and wake the worker with ucp_worker_signal. While there is work
// (or transfers are in flight and progress was made in the last kSpinWindow) the thread loops on
// ucp_worker_progress without sleeping; otherwise it arms the worker and polls its event fd
// (100 ms at most), so an idle transport does not spin a core.
//
// Delivery: LinkHandlers are called on the progress thread, outside any ucp callback (callbacks
// only record what arrived; the loop delivers after ucp_worker_progress returns). So a handler may
// call Send, Start and Close (even on its own link) but must not block, and must not call
// Connect/Listen/Accept or destroy the Transport.
//
// Wire format: every AM carries a WireHeader (kind, frame type, session id, per-link data sequence
// number) followed by the frame's meta bytes; the AM data is the payload. Payloads at or above
// options.ucx_rendezvous_threshold go by rendezvous (UCP_AM_SEND_FLAG_RNDV: zero-copy from the
// sender's Payload, which the send op holds until ucp completes it), smaller ones eagerly. Meta too
// large for an AM header (about 8 KiB) travels in front of the payload in the AM data instead (one
// copy; rare). Both ends are assumed to share byte order.
//
// Receiving: eager data is copied into a counted Payload. Rendezvous data is received with
// ucp_am_recv_data_nbx into a buffer from a pool registered once with ucp_mem_map (power-of-two
// classes 64 KiB..64 MiB, grown on demand up to a cap; beyond it an unregistered counted buffer),
// handed to the handler with Payload::Adopt; releasing the Payload (on any thread) returns the
// buffer to the pool.
//
// Ordering: data frames carry a per-link sequence number and are delivered in that order (a reorder
// window absorbs rendezvous receives that complete out of order); control frames are delivered as
// soon as they arrive. On the send side data frames wait in a per-link queue and at most
// kMaxDataFramesInFlight / kMaxDataBytesInFlight of them are posted to ucp at a time, while control
// frames are posted at once, so a control frame never waits behind a long data queue.
//
// Connection: Connect creates a client-server endpoint and sends a hello; the listening side
// answers with a hello-ack and only then offers the link to Accept, so Connect returns a working
// link. Close sends a "bye" AM (the peer reports "peer closed the link" at once, rather than a
// transport error, or nothing at all on transports that do not notice a closed endpoint) and
// force-closes the endpoint once the peer acknowledged the bye or after kByeBound. Peer failure is
// detected by ucp's error handler (UCP_ERR_HANDLING_MODE_PEER) with UCX endpoint keepalive
// (KEEPALIVE_INTERVAL, KEEPALIVE_NUM_EPS) enabled.
//
// UCX 1.13 specifics (see Core::Init): error mode PEER excludes transports without peer-failure
// support from the AM lane (posix, sysv, self) and requires memory invalidation from rendezvous
// lanes, and the sockaddr connection manager needs a transport on the network device the address
// resolves to. So a same-host link runs its AM lane over tcp and its rendezvous over cma (enabled
// with CMA_MEMORY_INVALIDATE=y), and a UCX_TLS without a network transport (posix,cma,self) gets
// tcp added for connection setup and the AM lane.
#include "transport/ucx_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace scd::transport {
namespace {

constexpr unsigned kAmId = 7;  // one AM id for everything; WireHeader::kind tells messages apart
constexpr uint8_t kWireVersion = 1;
constexpr uint8_t kFlagMetaInData = 1;
constexpr uint64_t kHelloMagic = 0x5CD0'0C0D'E5CD'0001ull;

// Receive buffer pool: classes 64 KiB << k, k = 0..10 (64 MiB); at most kPoolCapBytes registered.
constexpr size_t kMinPoolClass = size_t{64} << 10;
constexpr int kPoolClasses = 11;
constexpr size_t kPoolCapBytes = size_t{1} << 30;

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
constexpr absl::Duration kSpinWindow = absl::Milliseconds(2);
constexpr int kTimerPollMs = 10;
// A reorder window this far ahead of the next expected data frame means a broken peer.
constexpr uint64_t kMaxReorderWindow = uint64_t{1} << 20;
constexpr size_t kMaxCachedOps = 256;

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

std::string UcsError(ucs_status_t status) { return ucs_status_string(status); }

// "host:port" or "[v6]:port" -> resolved socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string host;  // as the caller wrote it
};

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("ucx address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("ucx address '", address, "' has a bad port"));
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

absl::StatusOr<SockAddr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

std::string FormatSockAddr(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (addr->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "?";
}

uint16_t SockAddrPort(const sockaddr* addr) {
  if (addr->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  if (addr->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Receive buffer pool.

// Registered receive buffers, reused. Take/Shutdown run where ucp calls are allowed (progress
// thread, or the destructor after it joined); Give may run on any thread (a Payload's release).
// Shared by the Payloads it hands out, so a Payload may outlive the Transport: after Shutdown the
// registrations are gone and a returned buffer is simply unmapped.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t capacity = 0;
    int size_class = 0;
    ucp_mem_h memh = nullptr;
  };

  explicit BufferPool(ucp_context_h context) : context_(context) {}
  ~BufferPool() {
    absl::MutexLock lock(&mu_);
    for (Buffer* buffer : all_) FreeMemory(buffer);
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A registered buffer of at least `n` bytes, or nullptr when `n` exceeds the largest class or the
  // pool is at its cap (the caller falls back to an unregistered counted buffer).
  Buffer* Take(size_t n) {
    int size_class = 0;
    while (size_class < kPoolClasses && (kMinPoolClass << size_class) < n) ++size_class;
    if (size_class == kPoolClasses) return nullptr;
    const size_t capacity = kMinPoolClass << size_class;
    {
      absl::MutexLock lock(&mu_);
      if (context_ == nullptr) return nullptr;
      auto& free_list = free_[size_class];
      if (!free_list.empty()) {
        Buffer* buffer = free_list.back();
        free_list.pop_back();
        return buffer;
      }
      if (mapped_bytes_ + capacity > kPoolCapBytes) return nullptr;
      mapped_bytes_ += capacity;  // reserved; mapping happens outside the lock
    }
    auto buffer = std::make_unique<Buffer>();
    buffer->capacity = capacity;
    buffer->size_class = size_class;
    void* memory = MapMemory(capacity);
    if (memory == nullptr) {
      Unreserve(capacity);
      return nullptr;
    }
    buffer->data = static_cast<uint8_t*>(memory);
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = memory;
    params.length = capacity;
    ucs_status_t status = ucp_mem_map(context_unlocked(), &params, &buffer->memh);
    if (status != UCS_OK) {
      spdlog::warn("ucx: ucp_mem_map of {} bytes failed: {}", capacity, UcsError(status));
      munmap(memory, capacity);
      Unreserve(capacity);
      return nullptr;
    }
    absl::MutexLock lock(&mu_);
    all_.insert(buffer.get());
    return buffer.release();
  }

  void Give(Buffer* buffer) {
    absl::MutexLock lock(&mu_);
    if (context_ == nullptr) {  // after Shutdown: nothing is reused any more
      all_.erase(buffer);
      FreeMemory(buffer);
      return;
    }
    free_[buffer->size_class].push_back(buffer);
  }

  // The first `n` bytes of `buffer` as a counted Payload that returns it to the pool when released.
  Payload Wrap(Buffer* buffer, size_t n) {
    return Payload::Adopt(buffer->data, n,
                          [pool = shared_from_this(), buffer] { pool->Give(buffer); });
  }

  // Unregisters every buffer (the context is about to go) and frees the idle ones; buffers still
  // held by Payloads are freed when those are released.
  void Shutdown() {
    absl::MutexLock lock(&mu_);
    if (context_ == nullptr) return;
    for (Buffer* buffer : all_) {
      if (buffer->memh != nullptr) ucp_mem_unmap(context_, buffer->memh);
      buffer->memh = nullptr;
    }
    for (auto& free_list : free_) {
      for (Buffer* buffer : free_list) {
        all_.erase(buffer);
        FreeMemory(buffer);
      }
      free_list.clear();
    }
    context_ = nullptr;
  }

 private:
  // Take's mapping runs on the thread that owns ucp calls, which is also the only thread that can
  // clear context_ (Shutdown), so reading it without the lock there is safe.
  ucp_context_h context_unlocked() ABSL_NO_THREAD_SAFETY_ANALYSIS { return context_; }

  void Unreserve(size_t capacity) {
    absl::MutexLock lock(&mu_);
    mapped_bytes_ -= capacity;
  }

  // Anonymous memory for a buffer, faulted in now rather than on the first receive into it, and
  // backed by transparent huge pages where it is large enough (2 MiB-aligned, so the kernel can):
  // fewer faults to populate it and fewer TLB misses while the NIC or cma copy fills it.
  static void* MapMemory(size_t capacity) {
    constexpr size_t kHugePage = size_t{2} << 20;
    if (capacity < kHugePage) {
      void* memory = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      return memory == MAP_FAILED ? nullptr : memory;
    }
    void* raw = mmap(nullptr, capacity + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
    if (aligned > start) munmap(raw, aligned - start);
    const size_t tail = start + kHugePage - aligned;
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + capacity), tail);
    void* memory = reinterpret_cast<void*>(aligned);
    madvise(memory, capacity, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
    if (madvise(memory, capacity, MADV_POPULATE_WRITE) == 0) return memory;
#endif
    for (size_t offset = 0; offset < capacity; offset += 4096) {
      static_cast<volatile uint8_t*>(memory)[offset] = 0;
    }
    return memory;
  }

  static void FreeMemory(Buffer* buffer) {
    munmap(buffer->data, buffer->capacity);
    delete buffer;
  }

  absl::Mutex mu_;
  ucp_context_h context_ ABSL_GUARDED_BY(mu_);  // null after Shutdown
  std::vector<Buffer*> free_[kPoolClasses] ABSL_GUARDED_BY(mu_);
  std::set<Buffer*> all_ ABSL_GUARDED_BY(mu_);
  size_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---------------------------------------------------------------------------------------------
// Link and listener state.

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
      : client(client_side), remote(std::move(remote_address)) {}

  const bool client;
  std::string remote;       // written before the link is published to a user thread
  std::string description;  // likewise

  // Shared with user threads.
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;     // Send accepts frames
  bool queued ABSL_GUARDED_BY(mu) = false;  // on Core::ready_links_
  bool close_called ABSL_GUARDED_BY(mu) = false;
  bool start_called ABSL_GUARDED_BY(mu) = false;
  std::deque<Frame> inbox ABSL_GUARDED_BY(mu);
  bool connect_done ABSL_GUARDED_BY(mu) = false;  // client: handshake finished or failed
  absl::Status connect_status ABSL_GUARDED_BY(mu);

  // Progress thread only.
  Phase phase = Phase::kConnecting;
  ucp_ep_h ep = nullptr;
  LinkHandler* handler = nullptr;
  bool started = false;
  absl::Status down_status;
  bool down_delivered = false;
  bool on_deliver_list = false;
  bool on_pump_list = false;
  bool awaiting_bye_ack = false;  // we sent a bye; close the endpoint once the peer acks it
  bool ack_bye = false;           // the peer sent a bye; ack it before closing the endpoint
  bool ack_pending = false;       // our bye-ack is on its way
  std::deque<Frame> ready;        // deliverable, in delivery order; held until Start
  std::deque<Frame> data_out;     // data frames waiting for the send window
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

struct ListenerState {
  std::string address;  // host as given, actual port

  absl::Mutex mu;
  std::deque<std::shared_ptr<LinkState>> accepted ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  // Progress thread only.
  ucp_listener_h handle = nullptr;
  class Core* core = nullptr;
};

struct SendOp {
  class Core* core = nullptr;
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
  class Core* core = nullptr;
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
  BufferPool::Buffer* buffer = nullptr;  // registered pool buffer, or
  Payload fallback;                      // an unregistered counted one
};

// ---------------------------------------------------------------------------------------------
// Core: the context, the worker, the progress thread and everything they own.

// The ops (ucp request contexts) of one kind: every op ever made is owned here (swept at
// shutdown); idle ones are reused, and after a burst the idle surplus beyond kMaxCachedOps goes.
// Used on the progress thread only.
template <typename Op>
class OpPool {
 public:
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
    if (idle_.size() <= kMaxCachedOps || all_.size() <= kMaxCachedOps) return;
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
  void CloseLink(const std::shared_ptr<LinkState>& link);
  // Closes everything, joins the progress thread and releases every ucp resource (bounded).
  void Shutdown();

 private:
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
  void Pump(const std::shared_ptr<LinkState>& link);
  void DeliverAll();
  void Deliver(const std::shared_ptr<LinkState>& link);
  void ProcessClosing(absl::Time now);
  void CloseEndpoint(const std::shared_ptr<LinkState>& link);
  void CheckHandshakes(absl::Time now);
  void CloseListenerNow(const std::shared_ptr<ListenerState>& listener);
  // Marks `link` down: no more sends or deliveries, queued frames released, OnLinkDown scheduled
  // and the endpoint's teardown scheduled. Makes no ucp call unless `bye` (so it is safe inside
  // ucp callbacks with bye = false).
  void LinkDown(const std::shared_ptr<LinkState>& link, absl::Status status, bool bye);
  void ScheduleDeliver(const std::shared_ptr<LinkState>& link);
  void SchedulePump(const std::shared_ptr<LinkState>& link);
  // Posts one AM on `link`; `frame` is the frame (kFrame) or empty.
  void PostAm(const std::shared_ptr<LinkState>& link, WireKind kind, Frame frame, bool data);
  void SendDone(SendOp* op, ucs_status_t status);
  ucs_status_t HandleAm(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);
  void RecvDone(RecvOp* op, ucs_status_t status);
  void Accept(const std::shared_ptr<LinkState>& link, bool control, uint64_t seq, Frame frame);
  void HandleEpError(ucp_ep_h ep, ucs_status_t status);
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
  std::shared_ptr<BufferPool> pool_;
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

absl::StatusOr<std::shared_ptr<Core>> Core::Create(const TransportOptions& options) {
  std::shared_ptr<Core> core(new Core(options));
  absl::Status status = core->Init();
  if (!status.ok()) return status;
  return core;
}

// The transports the context uses, from ucp_context_print_info's "resource" lines
// ("#      resource 1  :  md 1  dev 1  flags -- tcp/lo"); ucp 1.13 has no query for them.
std::vector<std::string> ContextTransports(ucp_context_h context) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_context_print_info(context, stream);
  fclose(stream);
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
    if (!absl::StrContains(line, "resource")) continue;
    size_t dashes = line.find("-- ");
    if (dashes == absl::string_view::npos) continue;
    absl::string_view resource = line.substr(dashes + 3);
    absl::string_view tl = resource.substr(0, resource.find('/'));
    while (!tl.empty() && tl.back() == ' ') tl.remove_suffix(1);
    if (!tl.empty() && std::find(out.begin(), out.end(), tl) == out.end()) out.emplace_back(tl);
  }
  free(text);
  return out;
}

// True for a UCX_TLS list that names no transport ucp's sockaddr connection manager can resolve
// an IP address to (an exclusion list "^..." or "all" keeps the network transports).
bool LacksNetworkTransport(absl::string_view tls) {
  static const char* const kNetwork[] = {
      "all", "tcp",  "ib",   "rc",       "rc_v",    "rc_x", "rc_verbs", "rc_mlx5",
      "ud",  "ud_v", "ud_x", "ud_verbs", "ud_mlx5", "dc",   "dc_x",     "dc_mlx5"};
  if (absl::StartsWith(tls, "^")) return false;
  for (absl::string_view tl : absl::StrSplit(tls, ',')) {
    tl = absl::StripAsciiWhitespace(tl);
    absl::ConsumePrefix(&tl, "\\");  // "\tcp": the same transport, without its aliases
    for (const char* network : kNetwork) {
      if (tl == network) return false;
    }
  }
  return true;
}

// Whether a UCX_TLS value (null: unset) may enable the cma transport.
bool MayUseCma(const char* tls) {
  if (tls == nullptr) return true;
  absl::string_view list = tls;
  const bool exclude = absl::ConsumePrefix(&list, "^");
  bool named = false;
  for (absl::string_view tl : absl::StrSplit(list, ',')) {
    tl = absl::StripAsciiWhitespace(tl);
    absl::ConsumePrefix(&tl, "\\");
    named |= tl == "cma" || tl == "sm" || tl == "shm" || tl == "scopy" || tl == "all";
  }
  return exclude ? !named : named;
}

absl::Status Core::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);  // honours UCX_* variables
  if (status != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucx: ucp_config_read: ", UcsError(status)));
  }
  // ucp's client-server setup (sockaddr CM) needs a transport on the network device the address
  // resolves to, and error mode PEER needs an AM lane with peer-failure support (posix and self
  // have none): in UCX 1.13 a shared-memory-only UCX_TLS (posix,cma,self) fails to connect with
  // "Destination is unreachable". Add tcp then: it carries connection setup and the AM lane, while
  // bulk data still moves by cma on a same-host link.
  if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr && LacksNetworkTransport(tls)) {
    const std::string value = absl::StrCat(tls, ",tcp");
    status = ucp_config_modify(config, "TLS", value.c_str());
    static std::atomic<bool> said{false};
    if (status == UCS_OK && !said.exchange(true)) {
      spdlog::info(
          "ucx: UCX_TLS={} has no transport for connection setup and peer-failure "
          "detection; using {}",
          tls, value);
    }
  }
  // Error mode PEER makes ucp 1.13 require memory-invalidation support from rendezvous lanes, which
  // the cma memory domain only advertises when asked to (its invalidation is a no-op), so without
  // this a same-host link loses cma and falls back to tcp for bulk data. The cost: after a link
  // fails with a rendezvous send in flight, a still-running peer could read that payload's memory
  // after the transport released it (reads only; get scheme).
  // (ucp hands unknown keys to the UCT components without their prefix; an unused key draws a
  // warning, hence only when cma may be in use.)
  if (std::getenv("UCX_CMA_MEMORY_INVALIDATE") == nullptr && MayUseCma(std::getenv("UCX_TLS"))) {
    status = ucp_config_modify(config, "MEMORY_INVALIDATE", "y");
    if (status != UCS_OK) {
      spdlog::warn("ucx: cannot set CMA_MEMORY_INVALIDATE=y: {}", UcsError(status));
    }
  }
  // Endpoint keepalive detects a dead peer below the application heartbeat; the user's own
  // UCX_KEEPALIVE_* settings win.
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    const int64_t us =
        std::max<int64_t>(1, absl::ToInt64Microseconds(options_.ucx_keepalive_interval));
    std::string value = absl::StrCat(us, "us");
    status = ucp_config_modify(config, "KEEPALIVE_INTERVAL", value.c_str());
    if (status != UCS_OK) {
      spdlog::warn("ucx: cannot set KEEPALIVE_INTERVAL={}: {}", value, UcsError(status));
    }
  }
  if (std::getenv("UCX_KEEPALIVE_NUM_EPS") == nullptr) {
    // Check every endpoint each round, so detection time does not grow with the link count.
    status = ucp_config_modify(config, "KEEPALIVE_NUM_EPS", "inf");
    if (status != UCS_OK) {
      spdlog::warn("ucx: cannot set KEEPALIVE_NUM_EPS=inf: {}", UcsError(status));
    }
  }
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = "scd";
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ucp_init: ", UcsError(status)));
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    ucp_cleanup(context_);
    context_ = nullptr;
    worker_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ucp_worker_create: ", UcsError(status)));
  }
  auto fail = [this](const std::string& what, ucs_status_t s) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucx: ", what, ": ", UcsError(s)));
  };
  status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) return fail("ucp_worker_get_efd", status);

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  status = ucp_worker_query(worker_, &attr);
  size_t max_header = status == UCS_OK ? attr.max_am_header : 1024;
  max_inline_meta_ = max_header > sizeof(WireHeader) ? max_header - sizeof(WireHeader) : 0;

  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kAmId;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = &Core::OnAm;
  handler.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &handler);
  if (status != UCS_OK) return fail("ucp_worker_set_am_recv_handler", status);

  pool_ = std::make_shared<BufferPool>(context_);

  std::vector<std::string> transports = ContextTransports(context_);
  capabilities_.backend = "ucx";
  capabilities_.cross_process = true;
  capabilities_.zero_copy_send = true;
  capabilities_.max_message_bytes = 0;
  capabilities_.devices = transports;
  static const char* const kRdma[] = {"rc", "rc_verbs", "rc_mlx5", "dc",  "dc_mlx5",
                                      "ud", "ud_verbs", "ud_mlx5", "srd", "gga"};
  for (const std::string& tl : transports) {
    for (const char* rdma : kRdma) capabilities_.rdma |= tl == rdma;
    capabilities_.gpu_memory |=
        absl::StartsWith(tl, "cuda") || absl::StartsWith(tl, "rocm") || absl::StartsWith(tl, "gdr");
  }
  devices_text_ = absl::StrJoin(transports, ",");

  absl::Notification started;
  thread_ = std::thread([this, &started] {
    thread_id_ = std::this_thread::get_id();
    started.Notify();
    Loop();
  });
  started.WaitForNotification();
  spdlog::debug("ucx: transport up (transports {}, max inline meta {} bytes)", devices_text_,
                max_inline_meta_);
  return absl::OkStatus();
}

bool Core::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  // One signal per batch: the loop takes both queues at once, so a non-empty queue already has a
  // wakeup pending. Signalled under the lock so Shutdown cannot destroy the worker meanwhile.
  const bool wake = commands_.empty() && ready_links_.empty();
  commands_.push_back(std::move(fn));
  if (wake) ucp_worker_signal(worker_);
  return true;
}

bool Core::RunAndWait(std::function<void()> fn, absl::Duration bound) {
  if (OnProgressThread()) {
    fn();
    return true;
  }
  auto done = std::make_shared<absl::Notification>();
  if (!Post([fn = std::move(fn), done] {
        fn();
        done->Notify();
      })) {
    return false;
  }
  return done->WaitForNotificationWithTimeout(bound);
}

// ---------------------------------------------------------------------------------------------
// User-thread API.

absl::StatusOr<std::shared_ptr<ListenerState>> Core::Listen(const std::string& address) {
  if (OnProgressThread()) {
    return absl::FailedPreconditionError("ucx: Listen must not be called from a link handler");
  }
  auto host_port = SplitHostPort(address);
  if (!host_port.ok()) return host_port.status();
  auto resolved = Resolve(host_port->first, host_port->second, /*passive=*/true);
  if (!resolved.ok()) return resolved.status();

  auto listener = std::make_shared<ListenerState>();
  listener->core = this;
  struct Result {
    absl::Status status;
    uint16_t port = 0;
  };
  auto result = std::make_shared<Result>();
  SockAddr addr = *resolved;
  addr.host = host_port->first;
  bool ran = RunAndWait(
      [this, listener, result, addr, address] {
        if (stopping_) {
          result->status = absl::CancelledError("ucx transport is shutting down");
          return;
        }
        ucp_listener_params_t params{};
        params.field_mask =
            UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.storage);
        params.sockaddr.addrlen = addr.length;
        params.conn_handler.cb = &Core::OnConnRequest;
        params.conn_handler.arg = listener.get();
        ucs_status_t status = ucp_listener_create(worker_, &params, &listener->handle);
        if (status != UCS_OK) {
          listener->handle = nullptr;
          result->status = absl::UnavailableError(
              absl::StrCat("ucx: cannot listen on ", address, ": ", UcsError(status)));
          return;
        }
        ucp_listener_attr_t attr{};
        attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        if (ucp_listener_query(listener->handle, &attr) == UCS_OK) {
          result->port = SockAddrPort(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
        }
        const std::string& host = addr.host;
        listener->address = absl::StrCat(
            host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", result->port);
        listeners_.push_back(listener);
      },
      kCommandBound);
  if (!ran)
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot listen on ", address, ": the transport is not running"));
  if (!result->status.ok()) return result->status;
  return listener;
}

absl::StatusOr<std::shared_ptr<LinkState>> Core::Connect(const std::string& address,
                                                         absl::Duration timeout) {
  if (OnProgressThread()) {
    return absl::FailedPreconditionError("ucx: Connect must not be called from a link handler");
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto host_port = SplitHostPort(address);
  if (!host_port.ok()) return host_port.status();
  auto resolved = Resolve(host_port->first, host_port->second, /*passive=*/false);
  if (!resolved.ok()) {
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot connect to ", address, ": ", resolved.status().message()));
  }
  auto link = std::make_shared<LinkState>(/*client_side=*/true, address);
  link->description = absl::StrCat("ucx ", address, " (", devices_text_, ")");  // until up
  SockAddr addr = *resolved;
  bool posted = Post([this, link, addr] {
    if (stopping_) {
      LinkDown(link, absl::CancelledError("the transport is shutting down"), false);
      return;
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&addr.storage);
    params.sockaddr.addrlen = addr.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Core::OnEpError;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {
      LinkDown(link, absl::UnavailableError(UcsError(status)), false);
      return;
    }
    link->ep = ep;
    eps_[ep] = link;
    link->phase = LinkState::Phase::kConnecting;
    PostAm(link, WireKind::kHello, Frame(), false);
  });
  if (!posted) {
    return absl::UnavailableError(
        absl::StrCat("ucx: cannot connect to ", address, ": the transport is shut down"));
  }
  auto finished = [&link]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu) { return link->connect_done; };
  {
    absl::MutexLock lock(&link->mu);
    if (link->mu.AwaitWithDeadline(absl::Condition(&finished), deadline)) {
      if (link->connect_status.ok()) return link;
      return absl::UnavailableError(
          absl::StrCat("ucx: cannot connect to ", address, ": ", link->connect_status.message()));
    }
  }
  // Timed out: give up on the endpoint unless the handshake finished just now (decided on the
  // progress thread, which owns the phase).
  RunAndWait(
      [this, link] {
        if (link->phase != LinkState::Phase::kUp) {
          LinkDown(link, absl::DeadlineExceededError("connect timed out"), false);
        }
      },
      kCommandBound);
  absl::MutexLock lock(&link->mu);
  if (link->connect_done && link->connect_status.ok()) return link;
  return absl::UnavailableError(
      absl::StrCat("ucx: no answer from ", address, " within ", absl::FormatDuration(timeout)));
}

void Core::CloseListener(const std::shared_ptr<ListenerState>& listener) {
  {
    absl::MutexLock lock(&listener->mu);
    if (listener->closed) return;
    listener->closed = true;  // Accept returns Cancelled from now on
  }
  RunAndWait([this, listener] { CloseListenerNow(listener); }, kCommandBound);
}

void Core::Start(const std::shared_ptr<LinkState>& link, LinkHandler* handler) {
  {
    absl::MutexLock lock(&link->mu);
    if (link->start_called) return;
    link->start_called = true;
  }
  auto start = [this, link, handler] {
    if (link->started) return;
    link->started = true;
    link->handler = handler;
    ScheduleDeliver(link);
  };
  if (OnProgressThread()) {
    start();
    return;
  }
  if (!Post(start)) {
    // The transport is gone: the link is down and nothing else will call the handler.
    handler->OnLinkDown(absl::CancelledError("ucx transport shut down"));
  }
}

absl::Status Core::Send(const std::shared_ptr<LinkState>& link, Frame frame) {
  {
    absl::MutexLock lock(&link->mu);
    if (!link->open) {
      return absl::FailedPreconditionError(absl::StrCat(link->description, " is down"));
    }
    link->inbox.push_back(std::move(frame));
    if (link->queued) return absl::OkStatus();
    link->queued = true;
  }
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::OkStatus();  // the shutdown drops the inbox
  const bool wake = commands_.empty() && ready_links_.empty();
  ready_links_.push_back(link);
  if (wake) ucp_worker_signal(worker_);
  return absl::OkStatus();
}

void Core::CloseLink(const std::shared_ptr<LinkState>& link) {
  bool first;
  {
    absl::MutexLock lock(&link->mu);
    first = !link->close_called;
    link->close_called = true;
    link->open = false;  // Send fails from now on, even before the progress thread gets here
  }
  if (!first) {
    // Another Close may still be running on the progress thread (a handler closing its own
    // link); wait for it, so that no handler call is left when this Close (or ~Link) returns.
    if (!OnProgressThread()) RunAndWait([] {}, kCommandBound);
    return;
  }
  // Waits so that the handler has had its OnLinkDown (and no other call) when Close returns.
  if (!RunAndWait(
          [this, link] {
            LinkDown(link, absl::CancelledError("link closed"), /*bye=*/true);
            Deliver(link);
          },
          kCommandBound)) {
    absl::MutexLock lock(&mu_);
    if (!stopped_) spdlog::error("ucx: closing {} timed out", link->description);
  }
}

void Core::Shutdown() {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  if (worker_ == nullptr) {  // Init failed before the thread started
    shut_down_ = true;
    return;
  }
  if (OnProgressThread()) {
    spdlog::error("ucx: the transport must not be destroyed from a link handler; leaking it");
    return;
  }
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    ucp_worker_signal(worker_);
  }
  thread_.join();

  // The thread is gone; this thread now owns the worker.
  for (void* request : close_requests_) ucp_request_free(request);
  close_requests_.clear();
  eps_.clear();
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  // Operations ucp never completed: their requests went with the worker; release what they hold.
  for (auto& op : send_ops_.all()) {
    if (op->in_flight) {
      op->in_flight = false;
      op->frame = Frame();
      op->bounce.Reset();
      op->link.reset();
    }
  }
  for (auto& op : recv_ops_.all()) {
    if (op->in_flight) {
      op->in_flight = false;
      if (op->buffer != nullptr) pool_->Give(op->buffer);
      op->buffer = nullptr;
      op->fallback.Reset();
      op->link.reset();
    }
  }
  pool_->Shutdown();
  ucp_cleanup(context_);
  context_ = nullptr;
  deliver_list_.clear();
  pump_list_.clear();
  hellos_.clear();
  handshaking_.clear();
  closing_.clear();
  listeners_.clear();
}

// ---------------------------------------------------------------------------------------------
// Progress thread.

void Core::Loop() {
  pthread_setname_np(pthread_self(), "scd-ucx");
  absl::Time stop_deadline = absl::InfiniteFuture();
  for (;;) {
    bool worked = TakeCommands();
    if (!stopping_) {
      absl::MutexLock lock(&mu_);
      stopping_ = stopped_;
    }
    if (stopping_ && stop_deadline == absl::InfiniteFuture()) {
      BeginShutdown();
      stop_deadline = absl::Now() + kShutdownBound;
    }
    worked |=
        !conn_requests_.empty() || !hellos_.empty() || !hello_acks_.empty() || !pump_list_.empty();
    ProcessConnRequests();
    ProcessHellos();
    ProcessHelloAcks();
    ProcessPumps();
    const unsigned events = ucp_worker_progress(worker_);
    worked |= !deliver_list_.empty();
    DeliverAll();
    const absl::Time now = absl::Now();
    if (!closing_.empty() || !close_requests_.empty()) ProcessClosing(now);
    if (!handshaking_.empty() && now >= next_handshake_check_) {
      CheckHandshakes(now);
      next_handshake_check_ = now + absl::Milliseconds(100);
    }
    if (stopping_ && (Quiescent() || now >= stop_deadline)) {
      // Commands posted just before the stop still run (they see stopping_ and give up).
      if (TakeCommands()) {
        DeliverAll();
        continue;
      }
      if (!Quiescent()) {
        spdlog::warn("ucx: shutdown bound reached with {} sends and {} receives in flight",
                     send_ops_in_flight_, recv_ops_in_flight_);
      }
      DrainWorker();
      break;
    }
    // Busy (something happened, or transfers are in flight and something happened lately):
    // progress again at once, since waking from the event fd costs each rendezvous round trip
    // tens of microseconds. Idle: sleep on the event fd. The spin window stops a stalled peer
    // from keeping this thread at 100 % while our sends wait on it.
    if (events > 0 || worked) {
      last_event_ = now;
      continue;
    }
    if ((send_ops_in_flight_ > 0 || recv_ops_in_flight_ > 0) && now - last_event_ < kSpinWindow) {
      continue;
    }
    Idle();
  }
}

bool Core::TakeCommands() {
  std::deque<std::function<void()>> commands;
  std::vector<std::shared_ptr<LinkState>> links;
  {
    absl::MutexLock lock(&mu_);
    if (commands_.empty() && ready_links_.empty()) return false;
    commands.swap(commands_);
    links.swap(ready_links_);
  }
  for (auto& command : commands) command();
  std::deque<Frame> frames;
  for (auto& link : links) {
    {
      absl::MutexLock lock(&link->mu);
      link->queued = false;
      frames.swap(link->inbox);
    }
    if (link->phase != LinkState::Phase::kUp) {
      frames.clear();  // down (or never up): released here
      continue;
    }
    for (Frame& frame : frames) {
      if (IsControl(frame.type)) {
        PostAm(link, WireKind::kFrame, std::move(frame), /*data=*/false);
        if (link->phase != LinkState::Phase::kUp) break;
      } else {
        link->data_out.push_back(std::move(frame));
      }
    }
    frames.clear();
    SchedulePump(link);
  }
  return true;
}

void Core::Idle() {
  ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  int timeout_ms = kIdlePollMs;
  // Shorter while something is pending: closing deadlines, and transfers whose completion should
  // not hinge on a single wakeup.
  if (!closing_.empty() || !close_requests_.empty() || stopping_ || send_ops_in_flight_ > 0 ||
      recv_ops_in_flight_ > 0) {
    timeout_ms = kTimerPollMs;
  }
  if (status != UCS_OK) {
    spdlog::warn("ucx: ucp_worker_arm: {}", UcsError(status));
    timeout_ms = 1;
  }
  pollfd fd{};
  fd.fd = event_fd_;
  fd.events = POLLIN;
  poll(&fd, 1, timeout_ms);
}

void Core::BeginShutdown() {
  for (auto& listener : std::vector<std::shared_ptr<ListenerState>>(listeners_)) {
    {
      absl::MutexLock lock(&listener->mu);
      listener->closed = true;
    }
    CloseListenerNow(listener);
  }
  std::vector<std::shared_ptr<LinkState>> links;
  links.reserve(eps_.size());
  for (auto& [ep, link] : eps_) links.push_back(link);
  for (auto& link : links) {
    LinkDown(link, absl::CancelledError("ucx transport shut down"), /*bye=*/true);
  }
  DeliverAll();
}

void Core::DrainWorker() {
  // Our requests are done, but ucp may still hold work it deferred (purging the pending queue of
  // a force-closed endpoint, a rendezvous completion message): UCX 1.13 asserts in
  // ucp_worker_destroy when a cma endpoint still has queued work. Progress until ucp reports
  // nothing for a while (bounded).
  const absl::Time end = absl::Now() + absl::Milliseconds(200);
  int quiet_rounds = 0;
  while (quiet_rounds < 100 && absl::Now() < end) {
    quiet_rounds = ucp_worker_progress(worker_) > 0 ? 0 : quiet_rounds + 1;
  }
}

bool Core::Quiescent() const {
  return closing_.empty() && close_requests_.empty() && send_ops_in_flight_ == 0 &&
         recv_ops_in_flight_ == 0;
}

void Core::CloseListenerNow(const std::shared_ptr<ListenerState>& listener) {
  auto it = std::find(listeners_.begin(), listeners_.end(), listener);
  if (it == listeners_.end()) return;
  // Requests that arrived before the close are refused (they still reference the ucp listener).
  for (auto& [owner, request] : conn_requests_) {
    if (owner == listener.get() && request != nullptr) {
      ucp_listener_reject(listener->handle, request);
      request = nullptr;
    }
  }
  std::deque<std::shared_ptr<LinkState>> accepted;
  {
    absl::MutexLock lock(&listener->mu);
    accepted.swap(listener->accepted);
  }
  for (auto& link : accepted) LinkDown(link, absl::CancelledError("listener closed"), true);
  for (auto& link : std::vector<std::shared_ptr<LinkState>>(handshaking_)) {
    if (link->listener == listener) LinkDown(link, absl::CancelledError("listener closed"), true);
  }
  ucp_listener_destroy(listener->handle);
  listener->handle = nullptr;
  listeners_.erase(it);
}

void Core::ProcessConnRequests() {
  if (conn_requests_.empty()) return;
  auto requests = std::move(conn_requests_);
  conn_requests_.clear();
  for (auto& [owner, request] : requests) {
    if (request == nullptr) continue;  // refused by CloseListenerNow
    std::shared_ptr<ListenerState> listener;
    for (auto& candidate : listeners_) {
      if (candidate.get() == owner) listener = candidate;
    }
    if (listener == nullptr) continue;
    bool closed;
    {
      absl::MutexLock lock(&listener->mu);
      closed = listener->closed;
    }
    if (closed || stopping_) {
      ucp_listener_reject(listener->handle, request);
      continue;
    }
    std::string remote = "?";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      remote = FormatSockAddr(reinterpret_cast<const sockaddr*>(&attr.client_address));
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Core::OnEpError;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {
      spdlog::warn("ucx: accepting a connection from {} on {} failed: {}", remote,
                   listener->address, UcsError(status));
      continue;
    }
    auto link = std::make_shared<LinkState>(/*client_side=*/false, remote);
    link->description = absl::StrCat("ucx ", remote, " (", devices_text_, ")");
    link->ep = ep;
    link->phase = LinkState::Phase::kHandshaking;
    link->listener = listener;
    link->handshake_deadline = absl::Now() + kHandshakeBound;
    eps_[ep] = link;
    handshaking_.push_back(link);
  }
}

void Core::ProcessHellos() {
  if (hellos_.empty()) return;
  auto hellos = std::move(hellos_);
  hellos_.clear();
  for (auto& link : hellos) {
    if (link->phase != LinkState::Phase::kHandshaking) continue;
    handshaking_.erase(std::remove(handshaking_.begin(), handshaking_.end(), link),
                       handshaking_.end());
    std::shared_ptr<ListenerState> listener = std::move(link->listener);
    link->listener.reset();
    link->description = DescribeEndpoint(*link);
    link->phase = LinkState::Phase::kUp;
    PostAm(link, WireKind::kHelloAck, Frame(), false);
    if (link->phase != LinkState::Phase::kUp) continue;
    bool offered = false;
    {
      absl::MutexLock lock(&listener->mu);
      if (!listener->closed) {
        listener->accepted.push_back(link);
        offered = true;
      }
    }
    if (!offered) LinkDown(link, absl::CancelledError("listener closed"), true);
  }
}

void Core::ProcessHelloAcks() {
  if (hello_acks_.empty()) return;
  auto acks = std::move(hello_acks_);
  hello_acks_.clear();
  for (auto& link : acks) {
    if (link->phase != LinkState::Phase::kConnecting) continue;
    link->description = DescribeEndpoint(*link);
    link->phase = LinkState::Phase::kUp;
    absl::MutexLock lock(&link->mu);
    link->connect_done = true;  // publishes the link (and its description) to Connect
    link->connect_status = absl::OkStatus();
  }
}

std::string Core::DescribeEndpoint(const LinkState& link) {
  std::vector<std::string> lanes;
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream != nullptr) {
    // Lines like "#   lane[1]:  1:tcp/lo.0 md[0] -> ..." ("lane[0]: cm tcp" for the CM lane).
    ucp_ep_print_info(link.ep, stream);
    fclose(stream);
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
      size_t at = line.find("lane[");
      if (at == absl::string_view::npos) continue;
      at = line.find("]:", at);
      if (at == absl::string_view::npos) continue;
      absl::string_view rest = line.substr(at + 2);
      while (!rest.empty() && (rest.front() == ' ' || absl::ascii_isdigit(rest.front()))) {
        rest.remove_prefix(1);
      }
      if (!absl::ConsumePrefix(&rest, ":")) continue;  // the CM lane has no resource
      absl::string_view tl = rest.substr(0, rest.find('/'));
      if (!tl.empty() && std::find(lanes.begin(), lanes.end(), tl) == lanes.end()) {
        lanes.emplace_back(tl);
      }
    }
    free(text);
  }
  return absl::StrCat("ucx ", link.remote, " (",
                      lanes.empty() ? devices_text_ : absl::StrJoin(lanes, ","), ")");
}

void Core::CheckHandshakes(absl::Time now) {
  for (auto& link : std::vector<std::shared_ptr<LinkState>>(handshaking_)) {
    if (link->phase == LinkState::Phase::kHandshaking && now >= link->handshake_deadline) {
      spdlog::warn("ucx: {} sent no hello within {}; dropping it", link->remote,
                   absl::FormatDuration(kHandshakeBound));
      LinkDown(link, absl::DeadlineExceededError("no hello"), false);
    }
  }
}

void Core::SchedulePump(const std::shared_ptr<LinkState>& link) { pump_list_.Add(link); }

void Core::ProcessPumps() {
  pump_list_.Drain([this](const std::shared_ptr<LinkState>& link) { Pump(link); });
}

void Core::Pump(const std::shared_ptr<LinkState>& link) {
  while (link->phase == LinkState::Phase::kUp && !link->data_out.empty()) {
    const size_t next = link->data_out.front().payload.size();
    if (link->data_in_flight > 0 && (link->data_in_flight >= kMaxDataFramesInFlight ||
                                     link->bytes_in_flight + next > kMaxDataBytesInFlight)) {
      return;  // a send completion reschedules the pump
    }
    Frame frame = std::move(link->data_out.front());
    link->data_out.pop_front();
    PostAm(link, WireKind::kFrame, std::move(frame), /*data=*/true);
  }
}

void Core::ScheduleDeliver(const std::shared_ptr<LinkState>& link) { deliver_list_.Add(link); }

void Core::DeliverAll() {
  // Handlers may make more deliveries due (Start on another link, Close): Drain loops until none.
  deliver_list_.Drain([this](const std::shared_ptr<LinkState>& link) { Deliver(link); });
}

void Core::Deliver(const std::shared_ptr<LinkState>& link) {
  if (!link->started) return;  // held until Start
  while (link->phase != LinkState::Phase::kDown && !link->ready.empty()) {
    Frame frame = std::move(link->ready.front());
    link->ready.pop_front();
    link->handler->OnFrame(std::move(frame));
  }
  if (link->phase == LinkState::Phase::kDown && !link->down_delivered) {
    link->down_delivered = true;
    link->ready.clear();
    link->handler->OnLinkDown(link->down_status);
  }
}

void Core::LinkDown(const std::shared_ptr<LinkState>& link, absl::Status status, bool bye) {
  if (link->phase == LinkState::Phase::kDown) return;
  const bool could_bye =
      link->phase == LinkState::Phase::kUp || link->phase == LinkState::Phase::kHandshaking;
  if (link->phase == LinkState::Phase::kHandshaking) {
    handshaking_.erase(std::remove(handshaking_.begin(), handshaking_.end(), link),
                       handshaking_.end());
  }
  link->phase = LinkState::Phase::kDown;
  link->down_status = status;
  link->listener.reset();
  std::deque<Frame> dropped;
  {
    absl::MutexLock lock(&link->mu);
    link->open = false;
    dropped.swap(link->inbox);
    if (!link->connect_done) {
      link->connect_done = true;
      link->connect_status = status;
    }
  }
  dropped.clear();
  link->data_out.clear();
  link->ready.clear();
  link->reorder.clear();  // pending rendezvous receives return their buffers when they complete
  ScheduleDeliver(link);
  if (link->ep == nullptr) return;
  absl::Time close_at = absl::Now();
  if (bye && could_bye) {
    // The peer learns at once; without it a closed shared-memory endpoint goes unnoticed.
    link->awaiting_bye_ack = true;
    PostAm(link, WireKind::kBye, Frame(), false);
    close_at += kByeBound;
  }
  closing_.push_back({link, close_at});
}

void Core::ProcessClosing(absl::Time now) {
  if (!closing_.empty()) {
    std::vector<Closing> due;
    std::vector<std::shared_ptr<LinkState>> acks;
    for (Closing& closing : closing_) {
      if (closing.link->ack_bye) {
        closing.link->ack_bye = false;
        closing.link->ack_pending = true;
        closing.close_at = now + kByeBound;
        acks.push_back(closing.link);
      }
    }
    // Posted here, outside ucp callbacks (the bye arrived in one).
    for (auto& link : acks) PostAm(link, WireKind::kByeAck, Frame(), false);
    for (size_t i = 0; i < closing_.size();) {
      const LinkState& link = *closing_[i].link;
      if ((!link.awaiting_bye_ack && !link.ack_pending) || now >= closing_[i].close_at) {
        due.push_back(std::move(closing_[i]));
        closing_[i] = std::move(closing_.back());
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    for (auto& closing : due) CloseEndpoint(closing.link);
  }
  for (size_t i = 0; i < close_requests_.size();) {
    if (ucp_request_check_status(close_requests_[i]) != UCS_INPROGRESS) {
      ucp_request_free(close_requests_[i]);
      close_requests_[i] = close_requests_.back();
      close_requests_.pop_back();
    } else {
      ++i;
    }
  }
}

void Core::CloseEndpoint(const std::shared_ptr<LinkState>& link) {
  ucp_ep_h ep = link->ep;
  if (ep == nullptr) return;
  link->ep = nullptr;
  eps_.erase(ep);
  // Forced: the bye told the peer already, and a flush could wait on a dead peer.
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &params);
  if (UCS_PTR_IS_PTR(request)) {
    close_requests_.push_back(request);
  } else if (UCS_PTR_IS_ERR(request)) {
    spdlog::debug("ucx: closing the endpoint to {}: {}", link->remote,
                  UcsError(UCS_PTR_STATUS(request)));
  }
}

SendOp* Core::NewSendOp() { return send_ops_.Take(this); }

void Core::FreeSendOp(SendOp* op) {
  op->link.reset();
  op->frame = Frame();
  op->bounce.Reset();
  op->in_flight = false;
  if (op->header.capacity() > 4096) std::string().swap(op->header);
  send_ops_.Give(op);
}

RecvOp* Core::NewRecvOp() { return recv_ops_.Take(this); }

void Core::FreeRecvOp(RecvOp* op) {
  op->link.reset();
  op->meta.clear();
  op->buffer = nullptr;
  op->fallback.Reset();
  op->in_flight = false;
  recv_ops_.Give(op);
}

void Core::PostAm(const std::shared_ptr<LinkState>& link, WireKind kind, Frame frame, bool data) {
  SendOp* op = NewSendOp();
  op->link = link;
  op->kind = kind;
  op->data = data;
  op->bytes = frame.payload.size();

  WireHeader header{};
  header.kind = static_cast<uint8_t>(kind);
  header.version = kWireVersion;
  header.frame_type = static_cast<uint8_t>(frame.type);
  header.session_id = frame.session_id;
  header.seq = data ? link->next_send_seq++ : (kind == WireKind::kHello ? kHelloMagic : 0);
  header.meta_len = static_cast<uint32_t>(frame.meta.size());
  const uint8_t* buffer = frame.payload.data();
  size_t length = frame.payload.size();
  const bool meta_in_data = frame.meta.size() > max_inline_meta_;
  if (meta_in_data) {
    header.flags |= kFlagMetaInData;
    uint8_t* out = nullptr;
    op->bounce = Payload::Allocate(frame.meta.size() + length, &out);
    std::memcpy(out, frame.meta.data(), frame.meta.size());
    if (length > 0) std::memcpy(out + frame.meta.size(), buffer, length);
    buffer = op->bounce.data();
    length = op->bounce.size();
  }
  op->header.assign(reinterpret_cast<const char*>(&header), sizeof(header));
  if (!meta_in_data) op->header.append(frame.meta);
  op->frame = std::move(frame);

  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  params.cb.send = &Core::OnSendComplete;
  params.user_data = op;
  // REPLY: the receiver learns which endpoint (link) a message came from.
  params.flags = UCP_AM_SEND_FLAG_REPLY;
  params.flags |= (length > 0 && length >= options_.ucx_rendezvous_threshold)
                      ? UCP_AM_SEND_FLAG_RNDV
                      : UCP_AM_SEND_FLAG_EAGER;
  if (data) {
    ++link->data_in_flight;
    link->bytes_in_flight += op->bytes;
  }
  op->in_flight = true;
  ++send_ops_in_flight_;
  ucs_status_ptr_t request = ucp_am_send_nbx(link->ep, kAmId, op->header.data(), op->header.size(),
                                             length > 0 ? buffer : nullptr, length, &params);
  if (request == nullptr) {
    SendDone(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    SendDone(op, UCS_PTR_STATUS(request));
  }
  // Otherwise OnSendComplete finishes it.
}

void Core::OnSendComplete(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  ucp_request_free(request);
  op->core->SendDone(op, status);
}

void Core::SendDone(SendOp* op, ucs_status_t status) {
  if (!op->in_flight) return;  // swept at shutdown already
  std::shared_ptr<LinkState> link = std::move(op->link);
  --send_ops_in_flight_;
  if (op->data) {
    --link->data_in_flight;
    link->bytes_in_flight -= op->bytes;
    SchedulePump(link);
  }
  if (op->kind == WireKind::kByeAck) link->ack_pending = false;
  if (op->kind == WireKind::kBye && status != UCS_OK) link->awaiting_bye_ack = false;
  FreeSendOp(op);
  if (status != UCS_OK) {
    LinkDown(
        link,
        absl::UnavailableError(link->phase == LinkState::Phase::kConnecting
                                   ? UcsError(status)
                                   : absl::StrCat("peer lost: send failed: ", UcsError(status))),
        false);
  }
}

ucs_status_t Core::OnAm(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<Core*>(arg)->HandleAm(header, header_length, data, length, param);
}

ucs_status_t Core::HandleAm(const void* header_bytes, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param) {
  // UCS_OK drops the message (for rendezvous: completes the sender's request without data).
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr ||
      header_length < sizeof(WireHeader)) {
    return UCS_OK;
  }
  WireHeader header;
  std::memcpy(&header, header_bytes, sizeof(header));
  if (header.version != kWireVersion) {
    spdlog::warn("ucx: dropping a message of wire version {} (mine is {})", header.version,
                 kWireVersion);
    return UCS_OK;
  }
  auto it = eps_.find(param->reply_ep);
  if (it == eps_.end()) return UCS_OK;
  std::shared_ptr<LinkState> link = it->second;
  if (link->phase == LinkState::Phase::kDown) {
    // Closing: the peer acked our bye, or closes too (then it needs no ack from us).
    const auto kind = static_cast<WireKind>(header.kind);
    if (kind == WireKind::kByeAck || kind == WireKind::kBye) link->awaiting_bye_ack = false;
    return UCS_OK;
  }

  switch (static_cast<WireKind>(header.kind)) {
    case WireKind::kHello:
      if (!link->client && link->phase == LinkState::Phase::kHandshaking &&
          header.seq == kHelloMagic) {
        hellos_.push_back(link);  // answered outside the callback
      }
      return UCS_OK;
    case WireKind::kHelloAck:
      if (link->client && link->phase == LinkState::Phase::kConnecting) {
        hello_acks_.push_back(link);  // finished outside the callback
      }
      return UCS_OK;
    case WireKind::kBye:
      LinkDown(link, absl::UnavailableError("peer closed the link"), false);
      link->ack_bye = link->ep != nullptr;
      return UCS_OK;
    case WireKind::kFrame:
      break;
    default:
      return UCS_OK;
  }
  if (header.frame_type < 1 || header.frame_type > kMaxFrameType) {
    spdlog::warn("ucx: {}: dropping a frame of unknown type {}", link->description,
                 header.frame_type);
    return UCS_OK;
  }
  const auto type = static_cast<FrameType>(header.frame_type);
  const bool control = IsControl(type);
  const bool meta_in_data = header.flags & kFlagMetaInData;
  const char* inline_meta = static_cast<const char*>(header_bytes) + sizeof(WireHeader);
  if (!meta_in_data && header_length - sizeof(WireHeader) != header.meta_len) {
    LinkDown(link, absl::InternalError("ucx: malformed frame header from peer"), false);
    return UCS_OK;
  }
  if (!control) {
    if (header.seq < link->recv_base || header.seq - link->recv_base > kMaxReorderWindow) {
      LinkDown(link,
               absl::InternalError(absl::StrCat("ucx: data frame out of sequence (got ", header.seq,
                                                ", expected ", link->recv_base, ")")),
               false);
      return UCS_OK;
    }
    const size_t index = header.seq - link->recv_base;
    if (link->reorder.size() <= index) link->reorder.resize(index + 1);
  }

  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    RecvOp* op = NewRecvOp();
    op->link = link;
    op->control = control;
    op->meta_in_data = meta_in_data;
    op->type = type;
    op->session_id = header.session_id;
    op->seq = header.seq;
    op->meta_len = header.meta_len;
    op->length = length;
    if (!meta_in_data) op->meta.assign(inline_meta, header.meta_len);
    void* destination = nullptr;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.recv_am = &Core::OnRecvComplete;
    params.user_data = op;
    op->buffer = pool_->Take(length);
    if (op->buffer != nullptr) {
      destination = op->buffer->data;
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      params.memh = op->buffer->memh;
    } else {
      uint8_t* out = nullptr;
      op->fallback = Payload::Allocate(length, &out);
      destination = out;
    }
    op->in_flight = true;
    ++recv_ops_in_flight_;
    ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, data, destination, length, &params);
    if (request == nullptr) {
      RecvDone(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      RecvDone(op, UCS_PTR_STATUS(request));
    }
    // Otherwise OnRecvComplete finishes it (possibly already has).
    return UCS_OK;
  }

  Frame frame;
  frame.type = type;
  frame.session_id = header.session_id;
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (meta_in_data) {
    if (length < header.meta_len) {
      LinkDown(link, absl::InternalError("ucx: malformed frame from peer"), false);
      return UCS_OK;
    }
    frame.meta.assign(reinterpret_cast<const char*>(bytes), header.meta_len);
    bytes += header.meta_len;
    length -= header.meta_len;
  } else {
    frame.meta.assign(inline_meta, header.meta_len);
  }
  if (length > 0) frame.payload = Payload::Copy(bytes, length);
  Accept(link, control, header.seq, std::move(frame));
  return UCS_OK;
}

void Core::OnRecvComplete(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  ucp_request_free(request);
  op->core->RecvDone(op, status);
}

void Core::RecvDone(RecvOp* op, ucs_status_t status) {
  if (!op->in_flight) return;  // swept at shutdown already
  --recv_ops_in_flight_;
  std::shared_ptr<LinkState> link = std::move(op->link);
  if (status != UCS_OK || link->phase == LinkState::Phase::kDown ||
      (op->meta_in_data && op->length < op->meta_len)) {
    if (op->buffer != nullptr) pool_->Give(op->buffer);
    FreeRecvOp(op);
    if (status != UCS_OK) {
      LinkDown(
          link,
          absl::UnavailableError(absl::StrCat("peer lost: receive failed: ", UcsError(status))),
          false);
    }
    return;
  }
  Payload whole =
      op->buffer != nullptr ? pool_->Wrap(op->buffer, op->length) : std::move(op->fallback);
  op->buffer = nullptr;
  Frame frame;
  frame.type = op->type;
  frame.session_id = op->session_id;
  if (op->meta_in_data) {
    frame.meta.assign(reinterpret_cast<const char*>(whole.data()), op->meta_len);
    const uint8_t* rest = whole.data() + op->meta_len;
    const size_t rest_size = whole.size() - op->meta_len;
    // A view past the meta that shares the buffer's owner.
    if (rest_size > 0) {
      frame.payload = Payload(rest, rest_size, std::make_shared<Payload>(std::move(whole)));
    }
  } else {
    frame.meta = std::move(op->meta);
    frame.payload = std::move(whole);
  }
  const bool control = op->control;
  const uint64_t seq = op->seq;
  FreeRecvOp(op);
  Accept(link, control, seq, std::move(frame));
}

void Core::Accept(const std::shared_ptr<LinkState>& link, bool control, uint64_t seq, Frame frame) {
  if (control) {
    link->ready.push_back(std::move(frame));
  } else {
    LinkState::RecvSlot& slot = link->reorder[seq - link->recv_base];
    slot.ready = true;
    slot.frame = std::move(frame);
    while (!link->reorder.empty() && link->reorder.front().ready) {
      link->ready.push_back(std::move(link->reorder.front().frame));
      link->reorder.pop_front();
      ++link->recv_base;
    }
  }
  ScheduleDeliver(link);
}

void Core::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<Core*>(arg)->HandleEpError(ep, status);
}

void Core::HandleEpError(ucp_ep_h ep, ucs_status_t status) {
  auto it = eps_.find(ep);
  if (it == eps_.end()) return;  // already closed by us
  std::shared_ptr<LinkState> link = it->second;
  // Nothing more will come from or go to this peer: close without waiting for bye traffic.
  link->awaiting_bye_ack = false;
  link->ack_bye = false;
  link->ack_pending = false;
  spdlog::debug("ucx: {}: endpoint error {}", link->description, UcsError(status));
  if (link->phase == LinkState::Phase::kConnecting) {
    LinkDown(link, absl::UnavailableError(UcsError(status)), false);
  } else {
    LinkDown(link, absl::UnavailableError(absl::StrCat("peer lost: ", UcsError(status))), false);
  }
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* listener = static_cast<ListenerState*>(arg);
  // Endpoints are created outside the callback, in the loop.
  listener->core->conn_requests_.emplace_back(listener, request);
}

// ---------------------------------------------------------------------------------------------
// The interface objects.

class UcxLink : public Link {
 public:
  UcxLink(std::shared_ptr<Core> core, std::shared_ptr<LinkState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~UcxLink() override { Close(); }

  void Start(LinkHandler* handler) override { core_->Start(state_, handler); }
  absl::Status Send(Frame frame) override { return core_->Send(state_, std::move(frame)); }
  void Close() override { core_->CloseLink(state_); }
  std::string Describe() const override { return state_->description; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<LinkState> state_;
};

class UcxListener : public Listener {
 public:
  UcxListener(std::shared_ptr<Core> core, std::shared_ptr<ListenerState> state)
      : core_(std::move(core)), state_(std::move(state)) {}
  ~UcxListener() override { Close(); }

  absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) override {
    absl::MutexLock lock(&state_->mu);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return state_->closed || !state_->accepted.empty();
    };
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("ucx: no connection on ", state_->address,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    if (state_->closed) {
      return absl::CancelledError(absl::StrCat("ucx listener ", state_->address, " closed"));
    }
    std::shared_ptr<LinkState> link = std::move(state_->accepted.front());
    state_->accepted.pop_front();
    return std::unique_ptr<Link>(std::make_unique<UcxLink>(core_, std::move(link)));
  }

  std::string address() const override { return state_->address; }
  void Close() override { core_->CloseListener(state_); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<ListenerState> state_;
};

class UcxTransport : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  // Links and listeners may outlive the transport; they keep the (shut down) core's memory alive.
  ~UcxTransport() override { core_->Shutdown(); }

  const Capabilities& capabilities() const override { return core_->capabilities(); }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    auto state = core_->Listen(address);
    if (!state.ok()) return state.status();
    return std::unique_ptr<Listener>(std::make_unique<UcxListener>(core_, *std::move(state)));
  }

  absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                absl::Duration timeout) override {
    auto state = core_->Connect(address, timeout);
    if (!state.ok()) return state.status();
    return std::unique_ptr<Link>(std::make_unique<UcxLink>(core_, *std::move(state)));
  }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options) {
  auto core = Core::Create(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(*std::move(core)));
}

}  // namespace scd::transport
