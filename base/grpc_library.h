// gRPC's shared machinery held for the rest of the process once this process makes a gRPC object.
// In gRPC 1.51 every channel and server with callback calls shares one completion queue and its
// "nexting" threads, counted by the channels and servers that use them; the last one to go shuts
// the queue down, joins those threads and frees it. When that last one goes on one of those
// very threads -- a call's reactor freed in its OnDone, holding the last reference to its
// channel -- the thread cannot join itself and goes on polling the freed queue: the next
// channel or server that makes a new queue meets it, and a queue unreferenced twice aborts the
// process (`ref_counted.h:183 assertion failed: prior > 0` in grpc_cq_internal_unref). A daemon
// keeps its server for its life and never meets this; a process that builds and drops whole gRPC
// stacks one after another (the tests, in-process benches) did: openai_api_test and
// migration_test aborted so in CI. (gRPC's library itself, initialized with the first object and
// shut down with the last, is held the same way.)
// So every gRPC server and channel this code makes holds them first (GrpcServerCredentials,
// GrpcChannelCredentials, the gated servers of proto/grpc_server.cc and the gRPC transport): a
// server with one callback service and no port, started once and never stopped; the process's
// exit ends it, as it ends a daemon's server.
// Not taken before main() on purpose: a process that forks without exec (scd-transport-bench's
// receiver) must not have gRPC's threads running at fork.
// Thread-safety: thread-safe.
#ifndef SCD_BASE_GRPC_LIBRARY_H_
#define SCD_BASE_GRPC_LIBRARY_H_

namespace scd {

// Starts the held server once per process (idempotent; cheap after the first call).
void HoldGrpcLibrary();
// Takes the hold and says whether it holds (false only when its server could not start).
bool GrpcLibraryHeld();

}  // namespace scd

#endif  // SCD_BASE_GRPC_LIBRARY_H_
