// Starting a gRPC server the way every node does: the given services behind a ConnectionGate on
// `listen` ("HOST:PORT"; port 0 picks a free one) that cannot be locked out by half-open
// connections, never shares its port (no SO_REUSEPORT: a port in use is an error), and hands gRPC
// a connection only once its HTTP/2 preface arrived (base/connection_gate.h); the address it
// actually bound. Every server also serves grpc.health.v1.Health (proto/health_service.h),
// NOT_SERVING until its node says it serves: a server started with no services of its own is what a
// node shows on its ports while it loads (StartLoadingServer). With TLS configured
// (base/grpc_tls.h) gRPC listens itself, serving TLS, and no gate stands in front. Every server
// offers gRPC server reflection. Without TLS: insecure transport credentials: the control plane
// authenticates its calls with the cluster secret (proto/cluster_secret.h); mutual TLS is the
// operations issue's. Thread-safety: StartGrpcServer is stateless; a GrpcServer is used from one
// thread.
#ifndef SCD_PROTO_GRPC_SERVER_H_
#define SCD_PROTO_GRPC_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/connection_gate.h"
#include "proto/health_service.h"

namespace scd {

struct GrpcServer {
  GrpcServer() = default;
  GrpcServer(GrpcServer&& other) = default;
  // Shuts this one down (at once) before taking `other`'s.
  GrpcServer& operator=(GrpcServer&& other);
  // Shuts down at once: running calls are cancelled.
  ~GrpcServer();

  // Declared first, so destroyed last: the server's calls reach it until the server is gone.
  std::unique_ptr<HealthService> health;
  std::unique_ptr<grpc::Server> server;
  std::string address;  // HOST:PORT as bound
  // Declared after `server`, so destroyed (stopped) first: no connection reaches a server that is
  // going away.
  std::unique_ptr<ConnectionGate> gate;

  // Ends health Watch streams, stops accepting, then shuts the server down (running calls get until
  // `deadline`) and frees it. Idempotent.
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
// with RESOURCE_EXHAUSTED. `service_names`: the full names of `services` (e.g.
// scd::v1::Inference::service_full_name()), which health checks may name beside "".
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services,
                                           ConnectionGateOptions gate_options = {},
                                           size_t max_receive_bytes = 0,
                                           std::vector<std::string> service_names = {});

// What a node serves on `listen` while it loads: only the health service, NOT_SERVING. The node
// shuts it down once loaded and starts its own server on the address it bound (`address`), so
// a probe sees NOT_SERVING, then (for the moment between) a refused connection, then SERVING.
absl::StatusOr<GrpcServer> StartLoadingServer(const std::string& listen);
// Shuts `loading` down and starts StartGrpcServer(loading's address, ...) in its place.
absl::StatusOr<GrpcServer> ServeAfterLoading(GrpcServer* loading,
                                             const std::vector<grpc::Service*>& services,
                                             std::vector<std::string> service_names,
                                             size_t max_receive_bytes = 0);

}  // namespace scd

#endif  // SCD_PROTO_GRPC_SERVER_H_
