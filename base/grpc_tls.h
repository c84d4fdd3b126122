// The process's TLS settings and the gRPC credentials made from them: every gRPC server of the
// process (public APIs, control planes, the gRPC transfer listener) and every channel it opens
// (to the coordinator, to nodes, to consumers' transfer listeners) use them, so one set of flags
// turns TLS on for a whole node (tools/tool_common.h: --tls-cert, --tls-key, --tls-ca,
// --tls-require-client-cert). Off (the default): insecure credentials, as before.
//   cert + key   this process's certificate chain and private key (PEM): servers present it;
//                with mutual TLS, channels present it too
//   ca           the CA bundle peers are verified against: channels check servers' certificates
//                (the address's host must be in the certificate's names); with
//                require_client_cert, servers check clients' certificates
// A process with only `ca` (a client such as `scd generate --server`) verifies servers and
// serves nothing over TLS. The HTTP listener takes the same files (base/http_server.h).
// Both credentials functions hold gRPC's library for the process (base/grpc_library.h).
// A separate library (scd_grpc_tls) so that scd_base stays free of gRPC.
// Thread-safety: ConfigureTls once, from main(), before any server or channel; the rest is
// thread-safe.
#ifndef SCD_BASE_GRPC_TLS_H_
#define SCD_BASE_GRPC_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace scd {

struct TlsFiles {
  std::string cert, key, ca;  // paths; "" = unset
  bool require_client_cert = false;
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

// Reads and checks the files (both of cert/key or neither; require_client_cert needs ca and a
// cert; each file readable PEM): INVALID_ARGUMENT naming the flag otherwise.
absl::Status ConfigureTls(const TlsFiles& files);
const TlsFiles& ConfiguredTls();
// Servers serve TLS (a certificate is configured).
bool ServesTls();

// With ServesTls(): gRPC itself listens on `listen` (HOST:PORT; an empty host: every interface)
// with the SSL server credentials: TLS handshakes need gRPC's own accept loop, so no
// ConnectionGate (base/connection_gate.h) stands in front; a handshake must finish within 10 s
// and SO_REUSEPORT is off (a busy port fails BuildAndStart). Returns where the bound port will be
// written by BuildAndStart (0: it could not listen).
std::shared_ptr<int> AddTlsListeningPort(grpc::ServerBuilder* builder, const std::string& listen);

// For servers: SSL server credentials when a certificate is configured, else insecure.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials();
// For channels: SSL credentials (roots: ca; identity: cert/key when set) when TLS is
// configured, else insecure.
std::shared_ptr<grpc::ChannelCredentials> GrpcChannelCredentials();

}  // namespace scd

#endif  // SCD_BASE_GRPC_TLS_H_
