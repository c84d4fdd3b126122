// CallCancellationWatch: turns "the caller of this sync gRPC handler went away" into the request's
// Cancellation (base/cancellation.h), whose callbacks wake whatever waits (a session, the
// admission queue). gRPC's sync server only reports cancellation through
// ServerContext::IsCancelled(), which nothing calls while a handler waits on a transfer; the watch
// looks at it on its own thread (every 10 ms) -- the one poll left, on the producer's Prefill,
// until that service moves to gRPC's callback API too (the public Generate and the consumer's
// Decode have: their EventStream is told, OnCancel).
// Thread-safety: construct and destroy on the handler's thread.
#ifndef SCD_PROTO_CALL_WATCH_H_
#define SCD_PROTO_CALL_WATCH_H_

#include <grpcpp/server_context.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "base/cancellation.h"

namespace scd {

class CallCancellationWatch {
 public:
  // REQUIRES: `context` and `cancellation` outlive the watch.
  CallCancellationWatch(grpc::ServerContext* context, Cancellation* cancellation);
  ~CallCancellationWatch();  // stops watching (a cancellation made stays)
  CallCancellationWatch(const CallCancellationWatch&) = delete;
  CallCancellationWatch& operator=(const CallCancellationWatch&) = delete;

 private:
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace scd

#endif  // SCD_PROTO_CALL_WATCH_H_
