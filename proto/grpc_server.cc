#include "proto/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/grpc_library.h"
#include "base/grpc_tls.h"
#include "base/host_port.h"

namespace scd {

void GrpcServer::Shutdown(absl::Time deadline) {
  if (health) health->EndWatches();
  if (gate) gate->Stop();
  if (server) server->Shutdown(absl::ToChronoTime(deadline));
  server.reset();
}

GrpcServer& GrpcServer::operator=(GrpcServer&& other) {
  if (this == &other) return *this;
  Shutdown(absl::Now());
  health = std::move(other.health);
  server = std::move(other.server);
  address = std::move(other.address);
  gate = std::move(other.gate);
  return *this;
}

GrpcServer::~GrpcServer() { Shutdown(absl::Now()); }

namespace {

// What every node's server sets, TLS or not.
void Configure(grpc::ServerBuilder* builder, const std::vector<grpc::Service*>& services,
               HealthService* health, size_t max_receive_bytes) {
  HoldGrpcLibrary();  // the gated server takes no credentials that would take it
  // A connection without a call for this long is closed (GOAWAY; a client's channel reconnects
  // on its next call): connections held open doing nothing do not pile up.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kMaxConnectionIdleMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              kMinPingIntervalMs);
  if (max_receive_bytes > 0) builder->SetMaxReceiveMessageSize(static_cast<int>(max_receive_bytes));
  for (grpc::Service* service : services) builder->RegisterService(service);
  builder->RegisterService(health);
}

}  // namespace

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services,
                                           ConnectionGateOptions gate_options,
                                           size_t max_receive_bytes,
                                           std::vector<std::string> service_names) {
  if (gate_options.preface.empty()) gate_options.preface = kHttp2ClientPreface;
  // Server reflection on every node (grpc.reflection.v1alpha): grpcurl-style tools list and call
  // the services without the .proto files. Registers a builder plugin once per process.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  GrpcServer started;
  started.health = std::make_unique<HealthService>(std::move(service_names));
  if (ServesTls()) {
    absl::StatusOr<HostPort> where = ParseHostPort(listen);
    if (!where.ok()) return where.status();
    grpc::ServerBuilder builder;
    std::shared_ptr<int> port = AddTlsListeningPort(&builder, listen);
    Configure(&builder, services, started.health.get(), max_receive_bytes);
    started.server = builder.BuildAndStart();
    if (started.server == nullptr || *port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen, " (TLS; address in use or not this host's)"));
    }
    where->port = static_cast<uint16_t>(*port);
    started.address = where->ToString();
    return started;
  }
  absl::StatusOr<std::unique_ptr<ConnectionGate>> gate =
      ConnectionGate::Listen(listen, std::move(gate_options));
  if (!gate.ok()) return gate.status();
  started.gate = *std::move(gate);
  grpc::ServerBuilder builder;  // no listening port of its own: the gate hands it connections
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  Configure(&builder, services, started.health.get(), max_receive_bytes);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server for ", listen));
  }
  started.address = started.gate->address();
  grpc::Server* server = started.server.get();
  started.gate->Start([server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
  return started;
}

absl::StatusOr<GrpcServer> StartLoadingServer(const std::string& listen) {
  return StartGrpcServer(listen, {});
}

absl::StatusOr<GrpcServer> ServeAfterLoading(GrpcServer* loading,
                                             const std::vector<grpc::Service*>& services,
                                             std::vector<std::string> service_names,
                                             size_t max_receive_bytes) {
  const std::string address = loading->address;
  loading->Shutdown(absl::Now());
  return StartGrpcServer(address, services, {}, max_receive_bytes, std::move(service_names));
}

}  // namespace scd
