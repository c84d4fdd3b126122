// The gRPC backend: a Link is one bidirectional `scd.v1.Transfer/Transfer` stream.
// Thread-safety: see transport/transport.h.
#ifndef SCD_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define SCD_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace scd::transport {

absl::StatusOr<std::unique_ptr<Transport>> NewGrpcTransport(const TransportOptions& options);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
