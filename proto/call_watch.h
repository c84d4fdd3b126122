// CallCancellationWatch: turns "the caller of this sync gRPC handler went away" into a flag that
// long-running work polls. gRPC's sync server only reports cancellation through
// ServerContext::IsCancelled(), which nothing calls while a handler waits on a transfer; the watch
// polls it on its own thread (every 10 ms), sets the flag and runs `on_cancel` once (to wake
// whatever waits: cancel a session, say).
// Thread-safety: the flag may be read from any thread; construct and destroy on the handler's.
#ifndef SCD_PROTO_CALL_WATCH_H_
#define SCD_PROTO_CALL_WATCH_H_

#include <grpcpp/server_context.h>

#include <atomic>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"

namespace scd {

class CallCancellationWatch {
 public:
  // REQUIRES: `context` and `flag` outlive the watch.
  CallCancellationWatch(grpc::ServerContext* context, std::atomic<bool>* flag,
                        std::function<void()> on_cancel = nullptr);
  ~CallCancellationWatch();  // stops watching (the flag keeps its value)
  CallCancellationWatch(const CallCancellationWatch&) = delete;
  CallCancellationWatch& operator=(const CallCancellationWatch&) = delete;

 private:
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace scd

#endif  // SCD_PROTO_CALL_WATCH_H_
