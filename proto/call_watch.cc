#include "proto/call_watch.h"

#include <utility>

#include "absl/time/time.h"

namespace scd {

CallCancellationWatch::CallCancellationWatch(grpc::ServerContext* context, std::atomic<bool>* flag,
                                             std::function<void()> on_cancel)
    : thread_([this, context, flag, on_cancel = std::move(on_cancel)] {
        while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
          if (!context->IsCancelled()) continue;
          flag->store(true);
          if (on_cancel) on_cancel();
          return;
        }
      }) {}

CallCancellationWatch::~CallCancellationWatch() {
  done_.Notify();
  thread_.join();
}

}  // namespace scd
