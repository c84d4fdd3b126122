// The in-process backend: both ends in one process; payloads are handed over without a copy (the
// receiver gets the sender's view and owner). Addresses are names in a process-wide table.
// Thread-safety: see transport/transport.h.
#ifndef SCD_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
#define SCD_TRANSPORT_INPROC_INPROC_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace scd::transport {

absl::StatusOr<std::unique_ptr<Transport>> NewInProcessTransport(const TransportOptions& options);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
