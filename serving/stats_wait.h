// The long poll behind every node's Stats (control.proto StatsRequest): a call that names the
// change count it last saw and a wait is answered once the process counted a change after it
// (base/change_notice.h) or its wait is over, so a caller that waits for a node to reach a state
// (a test waiting for every session to end; an operator's watch) reads it again on each change
// instead of polling. The wait is bounded: 10 s at most, the call's deadline, and 16 waiting calls
// per process (past that a call answers at once), since each waiting call holds one of the
// control plane's synchronous server threads.
// Thread-safety: call from any server thread.
#ifndef SCD_SERVING_STATS_WAIT_H_
#define SCD_SERVING_STATS_WAIT_H_

#include <grpcpp/server_context.h>

#include <cstdint>

#include "scd/v1/control.pb.h"

namespace scd {

// Waits as `request` asks (see above); returns the change count to report as
// NodeStats.change_count, read after the wait and before the caller fills in the state.
uint64_t AwaitStatsChange(const v1::StatsRequest& request, const grpc::ServerContext& context);

}  // namespace scd

#endif  // SCD_SERVING_STATS_WAIT_H_
