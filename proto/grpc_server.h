// Starting a gRPC server the way every node does: the given services behind a ConnectionGate on
// `listen` ("HOST:PORT"; port 0 picks a free one) that cannot be locked out by half-open
// connections, never shares its port (no SO_REUSEPORT: a port in use is an error), and hands gRPC
// a connection only once its HTTP/2 preface arrived (base/connection_gate.h); the address it
// actually bound. With TLS configured (base/grpc_tls.h) gRPC listens itself, serving TLS, and no
// gate stands in front. Every server offers gRPC server reflection. Without TLS: insecure transport credentials: the control plane authenticates its calls with
// the cluster secret (proto/cluster_secret.h); mutual TLS is the operations issue's.
// Thread-safety: StartGrpcServer is stateless; a GrpcServer is used from one thread.
#ifndef SCD_PROTO_GRPC_SERVER_H_
#define SCD_PROTO_GRPC_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/connection_gate.h"

namespace scd {

struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // HOST:PORT as bound
  // Declared after `server`, so destroyed (stopped) first: no connection reaches a server that is
  // going away.
  std::unique_ptr<ConnectionGate> gate;

  // Stops accepting, then shuts the server down (running calls get until `deadline`) and frees
  // it. Idempotent.
  void Shutdown(absl::Time deadline);
};

// How long a connection without any call stays open (established connections are bounded by
// this and by the descriptor ceiling; waiting ones by the gate).
inline constexpr int kMaxConnectionIdleMs = 5 * 60 * 1000;
// A client's keepalive pings are accepted this often, with or without calls (a coordinator pings
// its nodes every kNodeKeepaliveMs to notice a frozen one: coordinator/node_ejection.h); gRPC's
// defaults (a ping per 5 minutes, none without calls, GOAWAY after two early ones) would close
// the coordinator's connections as abusive.
inline constexpr int kMinPingIntervalMs = 200;

// UNAVAILABLE naming `listen` when it cannot listen there (in use: "address already in use").
// REQUIRES: the services outlive the server.
// `max_receive_bytes`: the largest request message (0: gRPC's 4 MiB); larger ones end the call
// with RESOURCE_EXHAUSTED.
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services,
                                           ConnectionGateOptions gate_options = {},
                                           size_t max_receive_bytes = 0);

}  // namespace scd

#endif  // SCD_PROTO_GRPC_SERVER_H_
