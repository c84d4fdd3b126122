// gRPC's shared machinery held for the process (base/grpc_library.h). Without the hold, a channel
// whose last reference goes in its own call's callback, after every other gRPC object went,
// shuts the shared callback queue down from one of the queue's own threads: that thread cannot
// join itself and lingers on the freed queue (the abort openai_api_test and migration_test met
// in CI, now and then, as its thread met the next queue). With the hold, cycle after cycle of
// servers and channels made and dropped that way finish, and gRPC stays initialized between them
// (without the hold it is shut down after each: checked to fail so).
#include "base/grpc_library.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>

namespace scd {
namespace {

// A server whose every method answers UNIMPLEMENTED, a call to it, and the call's channel dropped
// in the call's callback after the server went: that drop is the process's last own gRPC object.
void DropTheLastChannelInItsCallback() {
  grpc::CallbackGenericService service;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = std::make_shared<grpc::GenericStub>(server->InProcessChannel({}));
  std::mutex mu;
  std::condition_variable cv;
  bool answered = false, dropped = false;
  std::shared_ptr<grpc::GenericStub> held_by_callback = stub;
  stub.reset();
  grpc::ClientContext context;
  grpc::Slice payload("x");
  grpc::ByteBuffer request(&payload, 1), response;
  held_by_callback->UnaryCall(&context, "/none.None/Nothing", grpc::StubOptions(), &request,
                              &response, [&](grpc::Status status) {
                                EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
                                std::unique_lock<std::mutex> lock(mu);
                                answered = true;
                                cv.notify_all();
                                cv.wait(lock, [&] { return server == nullptr; });
                                held_by_callback.reset();  // the channel's last reference
                                dropped = true;
                                cv.notify_all();
                              });
  std::unique_lock<std::mutex> lock(mu);
  // waits: up to 30 s for the call's answer (a hang, not a latency bound)
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return answered; }));
  server->Shutdown();
  server.reset();
  cv.notify_all();
  // waits: up to 30 s for the callback to drop the channel (a hang, not a latency bound)
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return dropped; }));
}

TEST(GrpcLibraryTest, ChannelsDroppedOnGrpcsOwnThreadsLeaveGrpcUp) {
  HoldGrpcLibrary();
  HoldGrpcLibrary();  // idempotent
  ASSERT_TRUE(GrpcLibraryHeld());
  for (int i = 0; i < 30; ++i) {
    ASSERT_NO_FATAL_FAILURE(DropTheLastChannelInItsCallback());
    ASSERT_TRUE(grpc_is_initialized()) << "gRPC shut down after cycle " << i;
  }
}

}  // namespace
}  // namespace scd
