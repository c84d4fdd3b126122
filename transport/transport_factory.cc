// The one place that knows which backends this build has (the #if lives here and nowhere else).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"
#if SCD_HAVE_GRPC
#include "transport/grpc/grpc_transport.h"
#endif
#if SCD_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace scd::transport {

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out = {"inproc"};
#if SCD_HAVE_GRPC
  out.push_back("grpc");
#endif
#if SCD_HAVE_UCX
  out.push_back("ucx");
#endif
  return out;
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  // The connections' tick threads exist before the first connection: a node's threads are all
  // there once it serves (the soak counts them before and after its load).
  StartConnectionTicks();
  if (options.backend == "inproc") return NewInProcessTransport(options);
#if SCD_HAVE_GRPC
  if (options.backend == "grpc") return NewGrpcTransport(options);
#endif
#if SCD_HAVE_UCX
  if (options.backend == "ucx") return NewUcxTransport(options);
#endif
  if (options.backend == "grpc" || options.backend == "ucx") {
    return absl::UnimplementedError(absl::StrCat(
        "transport backend '", options.backend,
        "' is not in this build (have: ", absl::StrJoin(AvailableBackends(), ", "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport backend '", options.backend,
                   "' (have: ", absl::StrJoin(AvailableBackends(), ", "), ")"));
}

}  // namespace scd::transport
