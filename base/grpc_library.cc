#include "base/grpc_library.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <memory>

namespace scd {

namespace {

// The held server, started at the first call. Kept where LeakSanitizer finds it (a static that
// GrpcLibraryHeld reads): it is held on purpose, not leaked.
grpc::Server* HeldServer() {
  // A function-local static: started once, thread-safely. The server and its service are never
  // freed: a server with a callback service takes a reference to the shared callback queue at
  // its start and gives it back only at its destruction.
  static grpc::Server* const held = [] {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(new grpc::CallbackGenericService());
    return builder.BuildAndStart().release();
  }();
  return held;
}

}  // namespace

void HoldGrpcLibrary() { HeldServer(); }

bool GrpcLibraryHeld() { return HeldServer() != nullptr; }

}  // namespace scd
