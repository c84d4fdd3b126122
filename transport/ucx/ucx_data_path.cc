// The UCX data path: frames as active messages (AM). Payloads at or above
// options.ucx_rendezvous_threshold go by rendezvous (UCP_AM_SEND_FLAG_RNDV: zero-copy from the
// sender's Payload, which the send op holds until ucp completes it), smaller ones eagerly.
//
// Receiving: eager data is copied into a counted Payload. Rendezvous data is received with
// ucp_am_recv_data_nbx into a buffer of the registered ReceivePool and handed on with
// Payload::Adopt; releasing the Payload (on any thread) returns the buffer to the pool.
//
// Ordering: data frames carry a per-link sequence number and are delivered in that order (a reorder
// window absorbs rendezvous receives that complete out of order); control frames are delivered as
// soon as they arrive. On the send side frames wait in the link's LaneQueue: control frames are
// posted at once, and at most kMaxDataFramesInFlight / kMaxDataBytesInFlight data frames are posted
// to ucp at a time, so a control frame never waits behind a long data queue.
#include <spdlog/spdlog.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_core.h"

namespace scd::transport::ucx_internal {

void Core::Start(const std::shared_ptr<LinkState>& link, LinkHandler* handler) {
  {
    absl::MutexLock lock(&link->mu);
    if (link->start_called) return;
    link->start_called = true;
    link->handler = handler;
  }
  auto start = [link, handler] { link->gate->Start(handler); };
  if (OnProgressThread()) {
    start();
    return;
  }
  if (!Post(start)) {
    // The transport is gone: the link is down and nothing else will call the handler.
    link->gate->Start(handler);
    link->gate->Down(absl::CancelledError("ucx transport shut down"), /*drop_held=*/true);
  }
}

absl::Status Core::Send(const std::shared_ptr<LinkState>& link, Frame frame) {
  {
    absl::MutexLock lock(&link->mu);
    if (!link->open) {
      return absl::FailedPreconditionError(absl::StrCat(link->description, " is down"));
    }
    link->inbox.Push(std::move(frame));
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

void Core::DropSession(const std::shared_ptr<LinkState>& link, uint64_t session_id) {
  std::deque<Frame> dropped;  // released after the unlock
  {
    absl::MutexLock lock(&link->mu);
    dropped = link->inbox.DropSession(session_id);
  }
  dropped.clear();
  // What the progress thread took already waits in `out` until the send window lets it go.
  auto drop = [link, session_id] { link->out.DropSession(session_id); };
  if (OnProgressThread()) {
    drop();
  } else {
    Post(drop);
  }
}

void Core::SchedulePump(const std::shared_ptr<LinkState>& link) { pump_list_.Add(link); }

void Core::ProcessPumps() {
  pump_list_.Drain([this](const std::shared_ptr<LinkState>& link) { Pump(link); });
}

void Core::Pump(const std::shared_ptr<LinkState>& link) {
  while (link->phase == LinkState::Phase::kUp) {
    const Frame* next = link->out.Next();
    if (next == nullptr) return;
    const bool data = !IsControl(next->type);
    if (data && link->data_in_flight > 0 &&
        (link->data_in_flight >= kMaxDataFramesInFlight ||
         link->bytes_in_flight + next->payload.size() > kMaxDataBytesInFlight)) {
      return;  // a send completion reschedules the pump (control frames went first)
    }
    PostAm(link, WireKind::kFrame, *link->out.Pop(), data);
  }
}

void Core::ScheduleDeliver(const std::shared_ptr<LinkState>& link) { deliver_list_.Add(link); }

void Core::DeliverAll() {
  // Handlers may make more deliveries due (Start on another link, Close): Drain loops until none.
  deliver_list_.Drain([this](const std::shared_ptr<LinkState>& link) { Deliver(link); });
}

void Core::Deliver(const std::shared_ptr<LinkState>& link) {
  while (!link->ready.empty()) {  // the gate holds them until Start
    Frame frame = std::move(link->ready.front());
    link->ready.pop_front();
    link->gate->Deliver(std::move(frame));
  }
  if (link->phase == LinkState::Phase::kDown && !link->down_reported) {
    link->down_reported = true;
    link->gate->Down(link->down_status, /*drop_held=*/link->closed_here);
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
      HandleFrameAm(link, header, static_cast<const char*>(header_bytes) + sizeof(WireHeader),
                    header_length - sizeof(WireHeader), data, length, param);
      return UCS_OK;
    default:
      return UCS_OK;
  }
}

void Core::HandleFrameAm(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                         const char* inline_meta, size_t inline_meta_len, void* data, size_t length,
                         const ucp_am_recv_param_t* param) {
  // A malformed frame ends the link before anything is allocated for it: dropping it instead
  // would leave a hole in the data sequence that every later frame waits behind.
  auto malformed = [&](const std::string& why) {
    LinkDown(link, absl::DataLossError(absl::StrCat("ucx: malformed frame from peer: ", why)),
             false);
  };
  if (header.frame_type < 1 || header.frame_type > kMaxFrameType) {
    return malformed(absl::StrCat("unknown frame type ", header.frame_type));
  }
  const bool meta_in_data = header.flags & kFlagMetaInData;
  if (!meta_in_data && inline_meta_len != header.meta_len) {
    return malformed("header length does not match its meta");
  }
  if (meta_in_data && length < header.meta_len) {
    return malformed(
        absl::StrCat(length, " data bytes cannot hold ", header.meta_len, " bytes of meta"));
  }
  if (length > kMaxFramePayloadBytes + header.meta_len) {
    return malformed(
        absl::StrCat("a payload of ", length, " bytes (limit ", kMaxFramePayloadBytes, ")"));
  }
  if (!IsControl(static_cast<FrameType>(header.frame_type))) {
    if (header.seq < link->recv_base || header.seq - link->recv_base > kMaxReorderWindow) {
      LinkDown(link,
               absl::InternalError(absl::StrCat("ucx: data frame out of sequence (got ", header.seq,
                                                ", expected ", link->recv_base, ")")),
               false);
      return;
    }
    const size_t index = header.seq - link->recv_base;
    if (link->reorder.size() <= index) link->reorder.resize(index + 1);
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ReceiveRendezvous(link, header, inline_meta, data, length);
  } else {
    ReceiveEager(link, header, inline_meta, data, length);
  }
}

void Core::ReceiveRendezvous(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                             const char* inline_meta, void* data, size_t length) {
  const auto type = static_cast<FrameType>(header.frame_type);
  const bool meta_in_data = header.flags & kFlagMetaInData;
  RecvOp* op = NewRecvOp();
  op->link = link;
  op->control = IsControl(type);
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
    params.memh = static_cast<ucp_mem_h>(op->buffer->registration);
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
}

void Core::ReceiveEager(const std::shared_ptr<LinkState>& link, const WireHeader& header,
                        const char* inline_meta, const void* data, size_t length) {
  Frame frame;
  frame.type = static_cast<FrameType>(header.frame_type);
  frame.session_id = header.session_id;
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (header.flags & kFlagMetaInData) {
    frame.meta.assign(reinterpret_cast<const char*>(bytes), header.meta_len);
    bytes += header.meta_len;
    length -= header.meta_len;
  } else {
    frame.meta.assign(inline_meta, header.meta_len);
  }
  if (length > 0) {
    // The one copy out of ucp's buffer also takes the checksum (the session layer's CRC pass).
    uint8_t* out = nullptr;
    frame.payload = Payload::Allocate(length, &out);
    if (frame.type == FrameType::kChunk) {
      frame.payload_crc = Crc32cCopy(out, bytes, length);
    } else {
      std::memcpy(out, bytes, length);
    }
  }
  Accept(link, IsControl(frame.type), header.seq, std::move(frame));
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
  if (status != UCS_OK || link->phase == LinkState::Phase::kDown) {
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

}  // namespace scd::transport::ucx_internal
