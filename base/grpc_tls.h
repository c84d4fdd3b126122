// The process's TLS settings and the gRPC credentials made from them: every gRPC server of the
// process (public APIs, control planes, the gRPC transfer listener) and every channel it opens
// (to the coordinator, to nodes, to consumers' transfer listeners) use them, so one set of flags
// turns TLS on for a whole node (tools/tool_common.h: --tls-cert, --tls-key, --tls-ca,
// --tls-require-client-cert, --tls-server-name). Off (the default): insecure credentials.
//   cert + key   this process's certificate chain and private key (PEM): servers present it;
//                with mutual TLS, channels present it too
//   ca           the CA bundle peers are verified against: channels check servers' certificates
//                (the address's host must be in the certificate's names); with
//                require_client_cert, servers check clients' certificates
//   server_name  the name channels check servers' certificates for instead of the dialled
//                host: nodes dial each other at the addresses they registered (on Kubernetes,
//                pod IPs no certificate can name in advance), so the nodes of a cluster share a
//                certificate for one name (deploy/k8s/components/tls)
// A process with only `ca` (a client such as `scd generate --server`) verifies servers and
// serves nothing over TLS. The HTTP listener takes the same files (base/http_server.h).
// GrpcServerCredentials and NewGrpcChannel hold gRPC's library for the process
// (base/grpc_library.h).
// A separate library (scd_grpc_tls) so that scd_base stays free of gRPC.
// Thread-safety: ConfigureTls once, from main(), before any server or channel; the rest is
// thread-safe.
#ifndef SCD_BASE_GRPC_TLS_H_
#define SCD_BASE_GRPC_TLS_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace scd {

struct TlsFiles {
  std::string cert, key, ca;  // paths; "" = unset
  bool require_client_cert = false;
  std::string server_name;  // "" = the host of the address dialled
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

// Reads and checks the files (both of cert/key or neither; require_client_cert needs ca and a
// cert; server_name needs TLS on and is a host name; each file readable PEM): INVALID_ARGUMENT
// naming the flag otherwise.
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
// Every gRPC channel the process opens: SSL credentials (roots: ca; identity: cert/key when
// set; the certificate checked for server_name when set) when TLS is configured, else insecure;
// `args` as the caller sets them.
std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& address,
                                              grpc::ChannelArguments args = {});

}  // namespace scd

#endif  // SCD_BASE_GRPC_TLS_H_
