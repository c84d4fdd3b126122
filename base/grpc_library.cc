#include "base/grpc_library.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>

namespace scd {

void HoldGrpcLibrary() {
  // A function-local static: started once, thread-safely. The server and its service are never
  // freed: a server with a callback service takes a reference to the shared callback queue at
  // its start and gives it back only at its destruction.
  static grpc::Server* const held = [] {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(new grpc::CallbackGenericService());
    return builder.BuildAndStart().release();
  }();
  (void)held;
}

}  // namespace scd
