#include "proto/call_watch.h"

#include <utility>

#include "absl/time/time.h"

namespace scd {

CallCancellationWatch::CallCancellationWatch(grpc::ServerContext* context,
                                             Cancellation* cancellation)
    : thread_([this, context, cancellation] {
        while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
          if (!context->IsCancelled()) continue;
          cancellation->Cancel(absl::CancelledError("the caller went away"));
          return;
        }
      }) {}

CallCancellationWatch::~CallCancellationWatch() {
  done_.Notify();
  thread_.join();
}

}  // namespace scd
