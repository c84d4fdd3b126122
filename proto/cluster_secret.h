// The cluster secret: what authenticates every call on the control plane (scd.v1.Registry,
// Producer, Consumer and the coordinator's Stats). Every node of a deployment is given the same
// secret (a file, or the SCD_CLUSTER_SECRET environment variable); a client attaches it to each
// call as the `x-scd-cluster-secret` metadata entry, a service checks it first and answers
// UNAUTHENTICATED (with no detail of what was expected) when it is missing or wrong. The
// comparison takes the same time wherever the first difference is. The public Inference API does
// not take it. Mutual TLS replaces or joins it in the operations issue.
// Thread-safety: immutable after construction; Check and Attach are const.
#ifndef SCD_PROTO_CLUSTER_SECRET_H_
#define SCD_PROTO_CLUSTER_SECRET_H_

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/statusor.h"

namespace scd {

inline constexpr char kClusterSecretMetadata[] = "x-scd-cluster-secret";
inline constexpr char kClusterSecretEnv[] = "SCD_CLUSTER_SECRET";
inline constexpr size_t kMinClusterSecretBytes = 16;

class ClusterSecret {
 public:
  // From `file` when given (its content, surrounding whitespace trimmed), else from
  // $SCD_CLUSTER_SECRET. INVALID_ARGUMENT when neither is set, the file cannot be read, or the
  // secret is shorter than 16 bytes or holds characters metadata cannot carry (it must be printable
  // ASCII); the message says how to give one.
  static absl::StatusOr<ClusterSecret> Load(const std::string& file);
  // A fresh random secret (128 bits): for one process that runs every node (scd serve).
  static ClusterSecret Random();
  // INVALID_ARGUMENT as Load.
  static absl::StatusOr<ClusterSecret> Of(std::string value);

  // OK when the call carries this secret; UNAUTHENTICATED otherwise, logged once as a warning
  // naming the caller (escaped).
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  void Attach(grpc::ClientContext* context) const;
  const std::string& value() const { return value_; }

 private:
  explicit ClusterSecret(std::string value) : value_(std::move(value)) {}
  std::string value_;
};

}  // namespace scd

#endif  // SCD_PROTO_CLUSTER_SECRET_H_
