// A gRPC link: one bidirectional `scd.v1.Transfer/Transfer` stream on gRPC's callback API (no
// threads of our own: reactions run on gRPC's threads).
//
// Writer: gRPC allows one write in flight per stream. When it completes, the next message comes
// from the LaneQueue (control frames first), so a control frame waits for at most the one message
// being written; a chunk larger than the message limit goes out as pieces, control messages may
// go between them. DropSession drops a cancelled session's queued frames, except a chunk whose
// first piece is out (its pieces must follow, or the peer's reassembly breaks).
// Reader: one read in flight; each message is reassembled (chunk_codec.h) and handed to the
// DeliveryGate from the gRPC thread that completed the read (handlers only queue).
// Closing: the client half-closes (WritesDone) and the server answers by finishing the RPC with
// OK; the server closes by finishing with OK. Either way the peer sees its reads end at once and
// reports Unavailable("peer closed the link"). Waits are bounded: after kGracefulCloseWait the
// call is cancelled.
// Thread-safety: LinkCore is thread-safe; reactors are driven by gRPC.
#ifndef SCD_TRANSPORT_GRPC_GRPC_LINK_H_
#define SCD_TRANSPORT_GRPC_GRPC_LINK_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/delivery_gate.h"
#include "transport/grpc/chunk_codec.h"
#include "transport/lane_queue.h"
#include "transport/transport.h"

namespace scd::transport::grpc_internal {

// Close: how long the graceful end may take before the call is cancelled, then how long the
// cancelled call may take to wind down.
constexpr absl::Duration kGracefulCloseWait = absl::Milliseconds(300);
constexpr absl::Duration kCancelWait = absl::Seconds(2);

// What a LinkCore asks of the stream it rides on.
class StreamOps {
 public:
  virtual ~StreamOps() = default;
  // Starts writing `message` (one at a time; it stays untouched until LinkCore::OnWriteDone).
  virtual void Write(const grpc::ByteBuffer* message) = 0;
  // Nothing more will be written. `graceful`: the client half-closes; `status`: the server's
  // final status.
  virtual void EndWrites(bool graceful, const grpc::Status& status) = 0;
  virtual void Cancel() = 0;
};

// A link's queues, state and delivery, shared by the public Link object and the stream reactor
// (which outlives the Link until gRPC reports the RPC done).
class LinkCore {
 public:
  LinkCore(std::string description, bool is_client, size_t max_message_bytes,
           std::shared_ptr<ReceivePool> pool);
  ~LinkCore();
  LinkCore(const LinkCore&) = delete;
  LinkCore& operator=(const LinkCore&) = delete;

  const std::string& description() const { return gate_.description(); }

  // Set up before the link is shared.
  void Attach(StreamOps* stream);
  void set_channel(std::shared_ptr<grpc::Channel> channel);

  // ---- Link ----
  void Start(LinkHandler* handler) { gate_.Start(handler); }
  absl::Status Send(Frame frame);
  void DropSession(uint64_t session_id);
  // Stops the link, tells the local handler Cancelled and starts the graceful end; no waiting.
  void BeginClose();
  // BeginClose, then waits (bounded) for the stream to finish.
  void Close();
  void Cancel();
  bool WaitDone(absl::Time deadline);
  // Drops the channel (client links) once the stream is over; only from user threads.
  void ReleaseChannel();
  // Connect: whether the server took the stream (its initial metadata arrived) by `deadline`.
  bool WaitReady(absl::Time deadline);
  absl::Status final_status();

  // ---- stream reactor side ----
  void OnStreamReady(bool ok);
  // One received message. False: stop reading (the link failed).
  bool OnMessage(const grpc::ByteBuffer& message);
  // The read side ended (the peer finished or the call failed). `report`: how to tell the
  // handler, when already known.
  void OnReadsEnded(std::optional<absl::Status> report);
  void OnWriteDone(bool ok);
  // Last call from the reactor, after it is gone.
  void OnStreamDone(absl::Status report);
  // Any failure found on this side (malformed input, an exception in a reaction).
  void Fail(absl::Status status);

 private:
  // Stops taking frames, drops the queued ones and ends the writes once none is in flight.
  void StopLink(bool graceful, grpc::Status end_status);
  // Starts the next write (control first), or ends the writes of a stopped link.
  void Pump();

  const bool is_client_;
  const size_t max_message_bytes_;
  StreamOps* stream_ = nullptr;  // set by Attach; usable while a write or the hold keeps it alive
  Reassembler reassembler_;      // the reader's alone (one read in flight), then OnStreamDone's
  DeliveryGate gate_;

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Send refuses, queues dropped
  bool graceful_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  LaneQueue<OutFrame> queue_ ABSL_GUARDED_BY(mu_);  // the data front may be partly written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_ended_ ABSL_GUARDED_BY(mu_) = false;
  // The message being written; gRPC's from Write until OnWriteDone.
  grpc::ByteBuffer write_buf_;
  std::optional<bool> ready_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the reactor is gone
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);

  // Guards stream_ against the reactor's deletion for Cancel, which may come at any time.
  absl::Mutex stream_mu_;
  bool stream_live_ ABSL_GUARDED_BY(stream_mu_) = false;
};

// Starts a client stream on `stub` for `core`; the reactor deletes itself when the call is over.
void StartClientStream(std::shared_ptr<LinkCore> core, grpc::GenericStub* stub);
// The reactor of a stream the server accepted for `core`.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerStream(
    grpc::CallbackServerContext* context, std::shared_ptr<LinkCore> core);
// A reactor that refuses a stream with `status`.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* RejectStream(grpc::Status status);

// The public Link over a core.
std::unique_ptr<Link> NewGrpcLink(std::shared_ptr<LinkCore> core);

// Begins closing every link, then waits for all of them within one graceful period, cancelling
// the stragglers.
void CloseAll(const std::vector<std::shared_ptr<LinkCore>>& links);

// Channels must not be destroyed on gRPC's own threads (the last channel releases the callback
// completion queue and joins its threads), so a dead link parks its channel in a graveyard, which
// the process's reaper thread (StartReaper: one per process, started with the first gRPC
// transport so the process's thread count does not change when a link first dies) empties at
// once: a buried channel's TCP connection must not outlive its link until the next Connect.
// User threads (Connect, transport destruction) empty it too.
void StartReaper();
void BuryChannel(std::shared_ptr<grpc::Channel> channel);
void EmptyGraveyard();

}  // namespace scd::transport::grpc_internal

#endif  // SCD_TRANSPORT_GRPC_GRPC_LINK_H_
