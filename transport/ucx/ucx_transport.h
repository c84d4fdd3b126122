// The UCX (ucp) backend: a Link is one ucp endpoint; frames travel as active messages.
// Thread-safety: see transport/transport.h.
#ifndef SCD_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define SCD_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace scd::transport {

absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_UCX_UCX_TRANSPORT_H_
