// LinkCore drives one stream: a LaneQueue of OutFrames feeding gRPC's one write in flight, the
// Reassembler feeding a DeliveryGate; reactors only forward gRPC's events to it and never let an
// exception escape into gRPC.
#include "transport/grpc/grpc_link.h"

#include <grpcpp/generic/generic_stub.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <exception>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/work_queue.h"

namespace scd::transport::grpc_internal {

using ::grpc::ByteBuffer;

namespace {
constexpr char kMethod[] = "/scd.v1.Transfer/Transfer";

absl::Mutex graveyard_mu(absl::kConstInit);
std::vector<std::shared_ptr<grpc::Channel>>* graveyard ABSL_GUARDED_BY(graveyard_mu) = nullptr;

void EmptyGraveyardImpl() {
  std::vector<std::shared_ptr<grpc::Channel>> dead;
  {
    absl::MutexLock lock(&graveyard_mu);
    if (graveyard != nullptr) dead.swap(*graveyard);
  }
}

// Never destroyed, as gRPC's own globals; its one thread is no gRPC thread, so it may destroy
// the last channel.
WorkQueue& Reaper() {
  static WorkQueue* const reaper = new WorkQueue(1, "scd-grpc-reap");
  return *reaper;
}

void BuryChannelImpl(std::shared_ptr<grpc::Channel> channel) {
  bool first = false;
  {
    absl::MutexLock lock(&graveyard_mu);
    if (graveyard == nullptr) graveyard = new std::vector<std::shared_ptr<grpc::Channel>>();
    first = graveyard->empty();
    graveyard->push_back(std::move(channel));
  }
  // One emptying per burial into an empty graveyard; what is buried meanwhile goes with it.
  if (first) Reaper().Run(EmptyGraveyardImpl);
}

// Runs a reaction body; an exception takes the link down instead of escaping into gRPC.
template <typename Body>
void React(LinkCore* core, const char* what, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    core->Fail(absl::InternalError(absl::StrCat(core->description(), ": ", what, ": ", e.what())));
  } catch (...) {
    core->Fail(absl::InternalError(absl::StrCat(core->description(), ": ", what, " threw")));
  }
}

// One completed read of either reactor: the message to the core and the next read started, or the
// read side's end (reported as `end_report()` says).
void ReadDone(LinkCore* core, ByteBuffer* message, bool ok, const std::function<void()>& read_next,
              const std::function<std::optional<absl::Status>()>& end_report) {
  React(core, "read", [&] {
    if (ok && core->OnMessage(*message)) {
      message->Clear();
      read_next();
      return;
    }
    message->Clear();
    if (!ok) core->OnReadsEnded(end_report());
  });
}

// Tells a core its reactor is gone; nothing may escape into gRPC from OnDone.
void FinishCore(LinkCore* core, absl::Status report) {
  try {
    core->OnStreamDone(std::move(report));
  } catch (const std::exception& e) {
    spdlog::error("{}: finishing the stream: {}", core->description(), e.what());
  } catch (...) {
    spdlog::error("{}: finishing the stream failed", core->description());
  }
}

// ---------------------------------------------------------------------------------------------
// Reactors. Each deletes itself in OnDone, after which it tells its core.

class ClientStream final : public grpc::ClientBidiReactor<ByteBuffer, ByteBuffer>,
                           public StreamOps {
 public:
  ClientStream(std::shared_ptr<LinkCore> core, grpc::GenericStub* stub) : core_(std::move(core)) {
    stub->PrepareBidiStreamingCall(&context_, kMethod, grpc::StubOptions(), this);
    // Send() starts writes from outside reactions; the hold keeps the call until EndWrites.
    AddHold();
    core_->Attach(this);
    StartRead(&read_buf_);
    StartCall();
  }

  void Write(const ByteBuffer* message) override { StartWrite(message); }
  void EndWrites(bool graceful, const grpc::Status&) override {
    if (graceful) StartWritesDone();
    RemoveHold();
  }
  void Cancel() override { context_.TryCancel(); }

  void OnReadInitialMetadataDone(bool ok) override { core_->OnStreamReady(ok); }
  void OnReadDone(bool ok) override {
    // The status, and so what to report, arrives with OnDone.
    ReadDone(
        core_.get(), &read_buf_, ok, [this] { StartRead(&read_buf_); },
        [] { return std::optional<absl::Status>(); });
  }
  void OnWriteDone(bool ok) override {
    React(core_.get(), "write", [&] { core_->OnWriteDone(ok); });
  }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<LinkCore> core = std::move(core_);
    const grpc::StatusCode code = status.error_code();
    absl::Status report = absl::UnavailableError("peer closed the link");
    try {
      if (code == grpc::StatusCode::CANCELLED) {
        report = absl::UnavailableError(
            absl::StrCat(core->description(), ": peer closed the link (stream cancelled)"));
      } else if (code != grpc::StatusCode::OK) {
        report = absl::UnavailableError(absl::StrCat(core->description(), ": grpc stream failed (",
                                                     code, "): ", status.error_message()));
      } else {
        report =
            absl::UnavailableError(absl::StrCat(core->description(), ": peer closed the link"));
      }
    } catch (...) {
      // Keep the short report.
    }
    delete this;
    FinishCore(core.get(), std::move(report));
  }

 private:
  grpc::ClientContext context_;
  ByteBuffer read_buf_;
  std::shared_ptr<LinkCore> core_;
};

class ServerStream final : public grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>,
                           public StreamOps {
 public:
  ServerStream(grpc::CallbackServerContext* context, std::shared_ptr<LinkCore> core)
      : context_(context), core_(std::move(core)) {
    core_->Attach(this);
    // Lets the client's Connect return once the listener has taken the stream.
    StartSendInitialMetadata();
    StartRead(&read_buf_);
  }

  void Write(const ByteBuffer* message) override { StartWrite(message); }
  void EndWrites(bool, const grpc::Status& status) override { Finish(status); }
  void Cancel() override { context_->TryCancel(); }

  void OnReadDone(bool ok) override {
    ReadDone(
        core_.get(), &read_buf_, ok, [this] { StartRead(&read_buf_); },
        [this] { return std::optional<absl::Status>(PeerGone()); });
  }
  void OnWriteDone(bool ok) override {
    React(core_.get(), "write", [&] { core_->OnWriteDone(ok); });
  }
  void OnCancel() override {
    React(core_.get(), "cancel", [&] { core_->OnReadsEnded(PeerGone()); });
  }
  void OnDone() override {
    std::shared_ptr<LinkCore> core = std::move(core_);
    delete this;
    FinishCore(core.get(), absl::UnavailableError("stream finished"));
  }

 private:
  absl::Status PeerGone() const {
    if (context_->IsCancelled()) {
      return absl::UnavailableError(
          absl::StrCat(core_->description(),
                       ": stream cancelled (peer closed the link or the connection failed)"));
    }
    return absl::UnavailableError(absl::StrCat(core_->description(), ": peer closed the link"));
  }

  grpc::CallbackServerContext* context_;
  ByteBuffer read_buf_;
  std::shared_ptr<LinkCore> core_;
};

// Refuses a stream (the listener is closed).
class Rejecting final : public grpc::ServerBidiReactor<ByteBuffer, ByteBuffer> {
 public:
  explicit Rejecting(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

class GrpcLink final : public Link {
 public:
  explicit GrpcLink(std::shared_ptr<LinkCore> core) : core_(std::move(core)) {}
  ~GrpcLink() override { Close(); }

  void Start(LinkHandler* handler) override { core_->Start(handler); }
  absl::Status Send(Frame frame) override {
    return GuardExceptions("grpc Link::Send", [&] { return core_->Send(std::move(frame)); });
  }
  void Close() override {
    absl::Status status = GuardExceptions("grpc Link::Close", [&] {
      core_->Close();
      return absl::OkStatus();
    });
    if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  }
  void DropSession(uint64_t session_id) override {
    absl::Status status = GuardExceptions("grpc Link::DropSession", [&] {
      core_->DropSession(session_id);
      return absl::OkStatus();
    });
    if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  }
  std::string Describe() const override { return core_->description(); }

 private:
  std::shared_ptr<LinkCore> core_;
};

}  // namespace

void StartReaper() { Reaper(); }
void BuryChannel(std::shared_ptr<grpc::Channel> channel) { BuryChannelImpl(std::move(channel)); }
void EmptyGraveyard() { EmptyGraveyardImpl(); }

LinkCore::LinkCore(std::string description, bool is_client, size_t max_message_bytes,
                   std::shared_ptr<ReceivePool> pool)
    : is_client_(is_client),
      max_message_bytes_(max_message_bytes),
      reassembler_(std::move(pool)),
      gate_(std::move(description)) {}

LinkCore::~LinkCore() {
  absl::MutexLock lock(&mu_);
  if (channel_ != nullptr) BuryChannel(std::move(channel_));
}

void LinkCore::Attach(StreamOps* stream) {
  stream_ = stream;
  absl::MutexLock lock(&stream_mu_);
  stream_live_ = true;
}

void LinkCore::set_channel(std::shared_ptr<grpc::Channel> channel) {
  absl::MutexLock lock(&mu_);
  channel_ = std::move(channel);
}

absl::Status LinkCore::Send(Frame frame) {
  absl::StatusOr<OutFrame> out =
      PrepareFrame(std::move(frame), max_message_bytes_ + kMetaAllowance);
  if (!out.ok()) return out.status();
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      return absl::FailedPreconditionError(absl::StrCat(description(), ": link is down"));
    }
    queue_.Push(*std::move(out));
  }
  Pump();
  return absl::OkStatus();
}

void LinkCore::DropSession(uint64_t session_id) {
  std::deque<OutFrame> dropped;  // declared first: released after the unlock
  absl::MutexLock lock(&mu_);
  // A chunk already begun keeps its remaining pieces: the peer is reassembling it.
  dropped = queue_.DropSession(
      session_id, [](const OutFrame& out) { return out.started; }, [](OutFrame&, size_t) {});
}

void LinkCore::BeginClose() {
  // Report first: ending the stream makes gRPC end our reads, which would report the peer.
  gate_.Down(absl::CancelledError(absl::StrCat(description(), ": link closed locally")),
             /*drop_held=*/true);
  StopLink(/*graceful=*/true, grpc::Status::OK);
}

void LinkCore::Close() {
  BeginClose();
  // Inside this link's own handler call the stream cannot finish until we return.
  if (gate_.InHandler()) return;
  if (!WaitDone(absl::Now() + kGracefulCloseWait)) {
    Cancel();
    if (!WaitDone(absl::Now() + kCancelWait)) {
      spdlog::warn("{}: stream did not finish {} after cancel", description(),
                   absl::FormatDuration(kCancelWait));
    }
  }
  ReleaseChannel();
}

void LinkCore::Cancel() {
  absl::MutexLock lock(&stream_mu_);
  if (stream_live_) stream_->Cancel();
}

bool LinkCore::WaitDone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  return done_;
}

void LinkCore::ReleaseChannel() {
  std::shared_ptr<grpc::Channel> channel;  // declared first: destroyed after the unlock
  absl::MutexLock lock(&mu_);
  if (done_) channel.swap(channel_);
}

bool LinkCore::WaitReady(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_.has_value(); };
  mu_.AwaitWithDeadline(absl::Condition(&decided), deadline);
  return ready_.value_or(false);
}

absl::Status LinkCore::final_status() {
  absl::MutexLock lock(&mu_);
  return final_status_;
}

void LinkCore::OnStreamReady(bool ok) {
  absl::MutexLock lock(&mu_);
  if (!ready_.has_value()) ready_ = ok;
}

bool LinkCore::OnMessage(const ByteBuffer& message) {
  {
    absl::MutexLock lock(&mu_);
    // Closing: keep draining what the peer still sends so it can finish, deliver nothing.
    if (stopped_) return true;
  }
  absl::StatusOr<std::optional<Frame>> frame = reassembler_.Take(message);
  if (!frame.ok()) {
    reassembler_.Reset();
    Fail(absl::DataLossError(absl::StrCat(
        description(), ": malformed stream from the peer: ", frame.status().message())));
    return false;
  }
  if (frame->has_value()) gate_.Deliver(std::move(**frame));
  return true;
}

void LinkCore::OnReadsEnded(std::optional<absl::Status> report) {
  StopLink(/*graceful=*/false, grpc::Status::OK);
  if (report.has_value()) gate_.Down(*std::move(report), /*drop_held=*/false);
}

void LinkCore::OnWriteDone(bool ok) {
  ByteBuffer written;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    written.Swap(&write_buf_);
  }
  // Lets go of the payload slices as soon as gRPC has.
  written.Clear();
  if (!ok) {
    // The call is over; its read side ends too and reports why.
    StopLink(/*graceful=*/false, grpc::Status::OK);
    return;
  }
  Pump();
}

void LinkCore::OnStreamDone(absl::Status report) {
  StopLink(/*graceful=*/false, grpc::Status::OK);
  gate_.Down(report, /*drop_held=*/false);
  reassembler_.Reset();
  {
    absl::MutexLock lock(&stream_mu_);
    stream_live_ = false;
  }
  absl::MutexLock lock(&mu_);
  if (!ready_.has_value()) ready_ = false;
  final_status_ = std::move(report);
  done_ = true;
}

void LinkCore::Fail(absl::Status status) {
  spdlog::warn("{}", std::string(status.message()));
  const std::string message(status.message());
  gate_.Down(std::move(status), /*drop_held=*/true);
  StopLink(/*graceful=*/false, grpc::Status(grpc::StatusCode::INTERNAL, message));
  // The server's final status tells the client; the client must cancel to end the call.
  if (is_client_) Cancel();
}

void LinkCore::StopLink(bool graceful, grpc::Status end_status) {
  std::deque<OutFrame> queued;  // declared first: released after the unlock
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      stopped_ = true;
      graceful_ = graceful;
      end_status_ = std::move(end_status);
      queued = queue_.TakeAll();
    }
  }
  Pump();
}

void LinkCore::Pump() {
  std::optional<OutFrame> finished;  // declared first: released after the unlock
  bool write = false;
  bool end_writes = false;
  bool graceful = false;
  grpc::Status end_status;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || writes_ended_) return;
    if (stopped_) {
      writes_ended_ = true;
      end_writes = true;
      graceful = graceful_;
      end_status = end_status_;
    } else if (OutFrame* next = queue_.Next()) {
      ByteBuffer message = NextMessage(next, max_message_bytes_);
      write_buf_.Swap(&message);
      if (next->done()) finished = queue_.Pop();
      writing_ = true;
      write = true;
    }
  }
  if (write) stream_->Write(&write_buf_);
  if (end_writes) stream_->EndWrites(graceful, end_status);
}

void StartClientStream(std::shared_ptr<LinkCore> core, grpc::GenericStub* stub) {
  new ClientStream(std::move(core), stub);  // deletes itself when the call is over
}

grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* NewServerStream(
    grpc::CallbackServerContext* context, std::shared_ptr<LinkCore> core) {
  return new ServerStream(context, std::move(core));
}

grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* RejectStream(grpc::Status status) {
  return new Rejecting(std::move(status));
}

std::unique_ptr<Link> NewGrpcLink(std::shared_ptr<LinkCore> core) {
  return std::make_unique<GrpcLink>(std::move(core));
}

void CloseAll(const std::vector<std::shared_ptr<LinkCore>>& links) {
  for (const auto& link : links) link->BeginClose();
  const absl::Time graceful = absl::Now() + kGracefulCloseWait;
  for (const auto& link : links) {
    if (!link->WaitDone(graceful)) link->Cancel();
  }
  const absl::Time hard = absl::Now() + kCancelWait;
  for (const auto& link : links) {
    if (!link->WaitDone(hard)) {
      spdlog::warn("{}: stream did not finish after cancel", link->description());
    }
    link->ReleaseChannel();
  }
}

}  // namespace scd::transport::grpc_internal
