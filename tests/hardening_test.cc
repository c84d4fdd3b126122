// Hardening, tried from outside as a hostile client and a bad day would (issue 15), against real
// daemons on loopback: the control plane refuses every call without the cluster secret, on either
// port (the public one does not serve it at all); half-open connections past the descriptor limit
// do not lock the public port out; a used port is an error; server ids are random and a client's
// request_id cannot collide with another request; client text is escaped and cut in logs and
// errors; bad values are refused as a whole before any node works (no Started, nothing routed),
// counted in the coordinator's Stats; Health carries the version; config values are checked by type
// and range with messages that say which.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/inference.grpc.pb.h"
#include "scd/v1/registry.grpc.pb.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Bin;
using testing::Daemon;

std::string TempDir(const std::string& name) {
  const std::string dir =
      fs::temp_directory_path() / ("scd-hardening-" + std::to_string(getpid()) + "-" + name);
  fs::create_directories(dir);
  return dir;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

void Deadline(grpc::ClientContext* context, int seconds = 5) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// Health on `address`, within `timeout` (one attempt: the channel waits for the connection).
grpc::Status Health(const std::string& address, absl::Duration timeout,
                    v1::HealthResponse* response = nullptr) {
  auto stub = v1::Inference::NewStub(Channel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context.set_wait_for_ready(true);
  v1::HealthResponse ignored;
  return stub->Health(&context, v1::HealthRequest(), response ? response : &ignored);
}

// A TCP connection to `address` that sent `bytes` and nothing more (-1 when refused).
int HalfOpen(const std::string& address, const std::string& bytes) {
  HostPort where = testing::Ok(ParseHostPort(address));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(where.port);
  inet_pton(AF_INET, where.host.c_str(), &to.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  if (!bytes.empty()) [[maybe_unused]] auto n = write(fd, bytes.data(), bytes.size());
  return fd;
}

class CoordinatorHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(CoordinatorHardeningTest, WithoutTheSecretNobodyRegistersHeartbeatsOrDeregisters) {
  Daemon coordinator(dir_, "coordinator", {Bin("scd-coordinator"), "--listen", "127.0.0.1:0"});
  const std::string public_address = coordinator.Address();
  const std::string control = coordinator.ControlAddress();
  ASSERT_FALSE(control.empty());
  ASSERT_NE(public_address, control);

  v1::RegisterRequest fake;  // the hijack of the issue: a consumer named like a real one
  fake.set_role(v1::NODE_ROLE_CONSUMER);
  fake.set_address("127.0.0.1:1");
  fake.set_transfer_address("127.0.0.1:2");
  fake.set_capacity(1000);
  auto* model = fake.add_models();
  model->set_name("base");
  model->set_fingerprint("abcd");
  for (const std::string& address : {control, public_address}) {
    auto registry = v1::Registry::NewStub(Channel(address));
    const bool is_control = address == control;
    // Without a secret, or with a wrong one.
    for (const char* secret : {"", "not-the-cluster-secret-at-all"}) {
      auto with = [&](grpc::ClientContext* context) {
        Deadline(context);
        if (*secret) context->AddMetadata("x-scd-cluster-secret", secret);
      };
      const grpc::StatusCode expected =
          is_control ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::UNIMPLEMENTED;
      grpc::ClientContext c1, c2, c3, c4;
      with(&c1), with(&c2), with(&c3), with(&c4);
      v1::RegisterResponse registered;
      EXPECT_EQ(registry->Register(&c1, fake, &registered).error_code(), expected) << address;
      v1::HeartbeatRequest beat;
      beat.set_node_id("consumer-1");
      v1::HeartbeatResponse beaten;
      EXPECT_EQ(registry->Heartbeat(&c2, beat, &beaten).error_code(), expected) << address;
      v1::DeregisterRequest gone;
      gone.set_node_id("producer-3");
      v1::DeregisterResponse deregistered;
      EXPECT_EQ(registry->Deregister(&c3, gone, &deregistered).error_code(), expected) << address;
      v1::NodeStats stats;
      EXPECT_EQ(registry->Stats(&c4, v1::StatsRequest(), &stats).error_code(), expected)
          << address;
    }
  }
  EXPECT_TRUE(testing::Ok(ListModels(public_address, absl::Seconds(5))).empty());
  // With the secret the same call is taken (the refusals above are about the secret), and the
  // id it returns is 128 random bits, not a counter.
  auto registry = v1::Registry::NewStub(Channel(control));
  grpc::ClientContext context;
  Deadline(&context);
  context.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
  v1::RegisterResponse registered;
  ASSERT_TRUE(registry->Register(&context, fake, &registered).ok());
  EXPECT_EQ(registered.node_id().size(), std::string("consumer-").size() + 32);
  // The log never holds the secret.
  EXPECT_THAT(testing::ReadFile(coordinator.log()), Not(HasSubstr(testing::kTestClusterSecret)));
}

TEST_F(CoordinatorHardeningTest, WithoutTheSecretNobodyCallsPrefillOrDecode) {
  const std::string model = testing::ModelDir("stories260k");
  Daemon producer(dir_, "producer", {Bin("scd-producer"), "--model", model});
  Daemon consumer(dir_, "consumer", {Bin("scd-consumer"), "--model", model, "--name", "c"});
  const std::string producer_control = producer.ControlAddress();
  const std::string consumer_public = consumer.Address();
  const std::string consumer_control = consumer.ControlAddress();
  ASSERT_FALSE(producer_control.empty() || consumer_control.empty());
  // What the attacker sent: a prefill that dials an address of its choosing.
  v1::PrefillRequest prefill;
  prefill.set_session_id("0123456789abcdef0123456789abcdef");
  prefill.mutable_request()->set_prompt("Once upon a time");
  v1::PrefillTarget* target = prefill.add_targets();
  target->set_target("c");
  target->set_transfer_address("127.0.0.1:9");
  SetTargetMode(TransferMode::kRaw, target);
  v1::DecodeRequest decode;
  decode.set_target("c");
  SetTargetMode(TransferMode::kLocal, &decode);
  decode.mutable_request()->set_prompt("Once upon a time");
  for (const char* secret : {"", "not-the-cluster-secret-at-all"}) {
    auto context = [&](grpc::ClientContext* c) {
      Deadline(c);
      if (*secret) c->AddMetadata("x-scd-cluster-secret", secret);
    };
    {
      grpc::ClientContext c;
      context(&c);
      v1::PrefillResponse response;
      EXPECT_EQ(v1::Producer::NewStub(Channel(producer_control))
                    ->Prefill(&c, prefill, &response)
                    .error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext c;
      context(&c);
      v1::NodeStats stats;
      EXPECT_EQ(v1::Producer::NewStub(Channel(producer_control))
                    ->Stats(&c, v1::StatsRequest(), &stats)
                    .error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    for (const std::string& address : {consumer_control, consumer_public}) {
      grpc::ClientContext c;
      context(&c);
      auto reader = v1::Consumer::NewStub(Channel(address))->Decode(&c, decode);
      v1::GenerateEvent event;
      EXPECT_FALSE(reader->Read(&event)) << address;
      EXPECT_EQ(reader->Finish().error_code(), address == consumer_control
                                                   ? grpc::StatusCode::UNAUTHENTICATED
                                                   : grpc::StatusCode::UNIMPLEMENTED)
          << address;
      // Nobody but the coordinator ends a consumer's wait for its transfer.
      grpc::ClientContext t;
      context(&t);
      v1::TransferFailedRequest told;
      told.set_session_id(prefill.session_id());
      told.set_target("c");
      v1::TransferFailedResponse found;
      EXPECT_EQ(
          v1::Consumer::NewStub(Channel(address))->TransferFailed(&t, told, &found).error_code(),
          address == consumer_control ? grpc::StatusCode::UNAUTHENTICATED
                                      : grpc::StatusCode::UNIMPLEMENTED)
          << address;
    }
  }
  {
    // With the secret: another target's session is NOT_FOUND, one nobody expects is found none.
    v1::TransferFailedRequest told;
    told.set_session_id(prefill.session_id());
    told.set_reason("producer gone");
    for (const char* target : {"not-c", "c"}) {
      told.set_target(target);
      grpc::ClientContext t;
      Deadline(&t);
      t.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
      v1::TransferFailedResponse found;
      const grpc::Status status =
          v1::Consumer::NewStub(Channel(consumer_control))->TransferFailed(&t, told, &found);
      if (std::string(target) == "c") {
        EXPECT_TRUE(status.ok()) << status.error_message();
        EXPECT_EQ(found.found(), v1::TransferFailedResponse::FOUND_NONE);
      } else {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
      }
    }
  }
  // With the secret, Decode runs (the refusals above were the secret's).
  grpc::ClientContext c;
  Deadline(&c, 30);
  c.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
  decode.mutable_request()->set_max_tokens(2);
  auto reader = v1::Consumer::NewStub(Channel(consumer_control))->Decode(&c, decode);
  v1::GenerateEvent event, last;
  while (reader->Read(&event)) last = event;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(last.has_finished()) << last.DebugString();
  // The producer did no work for the unauthenticated prefills.
  grpc::ClientContext s;
  Deadline(&s);
  s.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
  v1::NodeStats stats;
  ASSERT_TRUE(v1::Producer::NewStub(Channel(producer_control))
                  ->Stats(&s, v1::StatsRequest(), &stats)
                  .ok());
  EXPECT_EQ(stats.prefills(), 0u);
  EXPECT_EQ(stats.ended().at("refused_unauthenticated"), 2u);
}

TEST_F(CoordinatorHardeningTest, DaemonsRefuseToStartWithoutASecret) {
  testing::CommandResult run = testing::RunCommand(
      "env -u SCD_CLUSTER_SECRET " + Bin("scd-coordinator") + " --listen 127.0.0.1:0");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("no cluster secret"));
  EXPECT_THAT(run.err, HasSubstr("--cluster-secret-file"));
  run = testing::RunCommand("SCD_CLUSTER_SECRET=short " + Bin("scd-coordinator"));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("at least 16"));
}

TEST_F(CoordinatorHardeningTest, HalfOpenConnectionsPastTheDescriptorLimitDoNotLockItOut) {
  // The coordinator may hold 512 descriptors; 1,200 connections that send only the start of the
  // HTTP/2 preface would exhaust them (gRPC 1.51 then never accepts again).
  Daemon coordinator(dir_, "coordinator",
                     {"/usr/bin/prlimit", "--nofile=512:512", Bin("scd-coordinator"), "--listen",
                      "127.0.0.1:0"});
  const std::string address = coordinator.Address();
  ASSERT_TRUE(Health(address, absl::Seconds(10)).ok());
  std::vector<int> held;
  for (int i = 0; i < 1200; ++i) {
    const int fd = HalfOpen(address, "PRI * HTTP/2.0\r\n");
    if (fd >= 0) held.push_back(fd);
  }
  EXPECT_GT(held.size(), 1000u);
  const absl::Time start = absl::Now();
  v1::HealthResponse health;
  const grpc::Status status = Health(address, absl::Seconds(5), &health);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(health.status(), "serving");
  for (int fd : held) close(fd);
  // And it keeps accepting afterwards (the old failure: never again, minutes later).
  EXPECT_TRUE(Health(address, absl::Seconds(5)).ok());
  EXPECT_THAT(testing::ReadFile(coordinator.log()), Not(HasSubstr("Too many open files")));
}

TEST_F(CoordinatorHardeningTest, AUsedPortIsAnErrorOnEveryBinary) {
  Daemon first(dir_, "first", {Bin("scd-coordinator"), "--listen", "127.0.0.1:0"});
  const std::string used = first.Address();
  const std::string used_control = first.ControlAddress();
  const std::string models = testing::ModelDir("stories260k");
  const std::vector<std::string> commands = {
      Bin("scd-coordinator") + " --listen " + used,
      Bin("scd-coordinator") + " --control-listen " + used_control,
      Bin("scd-producer") + " --model " + models + " --control-listen " + used,
      Bin("scd-consumer") + " --model " + models + " --listen " + used,
      Bin("scd-consumer") + " --model " + models + " --control-listen " + used,
      Bin("scd") + " serve --all-in-one --producer-model " + models + " --consumer c=" + models +
          " --listen " + used};
  for (const std::string& command : commands) {
    testing::CommandResult run = testing::RunCommand(
        absl::StrCat("SCD_CLUSTER_SECRET=", testing::kTestClusterSecret, " timeout 60 ", command));
    EXPECT_EQ(run.exit_code, 1) << command << "\n" << run.err;
    EXPECT_THAT(run.err, HasSubstr("already in use")) << command;
  }
  EXPECT_TRUE(Health(used, absl::Seconds(5)).ok());  // the first one still serves
}

TEST_F(CoordinatorHardeningTest, ConfigValuesAreCheckedByTypeAndRange) {
  const std::string models = testing::ModelDir("stories260k");
  struct Case {
    std::string args, says;
  } cases[] = {
      {Bin("scd-producer") + " --model " + models + " --link-gbps -5", "--link-gbps"},
      {Bin("scd-consumer") + " --model " + models + " --capacity many", "many"},
      {Bin("scd-coordinator") + " --config " + dir_, "directory"},
      {Bin("scd-coordinator") + " --lease-ms soon", "soon"},
  };
  for (const Case& c : cases) {
    testing::CommandResult run = testing::RunCommand(c.args);
    EXPECT_NE(run.exit_code, 0) << c.args;
    EXPECT_THAT(run.err + run.out, HasSubstr(c.says)) << c.args;
    EXPECT_THAT(run.err + run.out, Not(HasSubstr("not readable"))) << c.args;
  }
  // "many" is not a number: said so, not reported as out of range.
  testing::CommandResult many =
      testing::RunCommand(Bin("scd-consumer") + " --model " + models + " --capacity many");
  EXPECT_THAT(many.err + many.out, Not(HasSubstr("range"))) << many.err;
}

// The public API of an all-in-one server (the base model and an identical copy: raw is exact).
class ServingHardeningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("serving"));
    const std::string base = testing::ModelDir("stories260k");
    server_ = new Daemon(*dir_, "serve",
                         {Bin("scd"), "serve", "--all-in-one", "--producer-model", base,
                          "--consumer", "copy=" + base, "--consumer",
                          "xs=" + testing::ModelDir("llama2xs-260k"), "--listen", "127.0.0.1:0",
                          "--log-level", "info"});
    address_ = new std::string(server_->Address(absl::Seconds(60)));
    control_ = new std::string(server_->ControlAddress());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete address_;
    delete control_;
    fs::remove_all(*dir_);
    delete dir_;
  }

  struct Reply {
    absl::Status status;
    std::vector<v1::GenerateEvent> events;
  };
  static Reply Generate(const v1::GenerateRequest& request) {
    Reply reply;
    reply.status = StreamGenerate(*address_, request, absl::Seconds(30),
                                  [&](const v1::GenerateEvent& e) { reply.events.push_back(e); });
    return reply;
  }
  static v1::GenerateRequest Request(const std::string& target = "copy") {
    v1::GenerateRequest request;
    request.add_targets(target);
    request.set_prompt("Once upon a time");
    request.set_max_tokens(4);
    SetRequestMode(TransferMode::kRaw, &request);
    return request;
  }
  static std::map<std::string, uint64_t> CoordinatorStats() {
    auto stub = v1::Registry::NewStub(Channel(*control_));
    grpc::ClientContext context;
    Deadline(&context);
    context.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
    v1::NodeStats stats;
    EXPECT_TRUE(stub->Stats(&context, v1::StatsRequest(), &stats).ok());
    return {stats.ended().begin(), stats.ended().end()};
  }

  static std::string* dir_;
  static Daemon* server_;
  static std::string* address_;
  static std::string* control_;
};
std::string* ServingHardeningTest::dir_ = nullptr;
Daemon* ServingHardeningTest::server_ = nullptr;
std::string* ServingHardeningTest::address_ = nullptr;
std::string* ServingHardeningTest::control_ = nullptr;

TEST_F(ServingHardeningTest, BadValuesAreRefusedAsAWholeBeforeAnyWork) {
  const uint64_t routed_before = CoordinatorStats()["routed"];
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest*)> spoil;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"max_tokens 2^31", [](auto* r) { r->set_max_tokens(1u << 31); },
       absl::StatusCode::kOutOfRange, "max_tokens"},
      {"max_tokens 2^32-1", [](auto* r) { r->set_max_tokens(~0u); }, absl::StatusCode::kOutOfRange,
       "max_tokens"},
      {"top_k 2^31", [](auto* r) { r->set_top_k(1u << 31); }, absl::StatusCode::kOutOfRange,
       "top_k"},
      {"top_p -1", [](auto* r) { r->set_top_p(-1); }, absl::StatusCode::kOutOfRange, "top_p"},
      {"top_p NaN", [](auto* r) { r->set_top_p(std::nanf("")); }, absl::StatusCode::kOutOfRange,
       "top_p"},
      {"temperature inf", [](auto* r) { r->set_temperature(INFINITY); },
       absl::StatusCode::kOutOfRange, "temperature"},
      {"both prompts", [](auto* r) { r->add_prompt_ids(1); }, absl::StatusCode::kInvalidArgument,
       "prompt_ids"},
      {"invalid UTF-8 prompt", [](auto* r) { r->set_prompt("caf\xc3(\xff"); },
       absl::StatusCode::kInvalidArgument, "prompt: not valid UTF-8"},
      {"invalid UTF-8 stop", [](auto* r) { r->add_stop("\xed\xa0\x80"); },
       absl::StatusCode::kInvalidArgument, "stop[0]: not valid UTF-8"},
      {"17 targets",
       [](auto* r) {
         for (int i = 0; i < 16; ++i) r->add_targets(absl::StrCat("t", i));
       },
       absl::StatusCode::kOutOfRange, "targets"},
      {"a 1 MB target", [](auto* r) { r->set_targets(0, std::string(1 << 20, 'x')); },
       absl::StatusCode::kOutOfRange, "targets[0]"},
      {"a 2.1 MB request id", [](auto* r) { r->set_request_id(std::string(2100000, 'a')); },
       absl::StatusCode::kInvalidArgument, "request_id"},
      {"a forged log line", [](auto* r) { r->set_request_id("x\n[error] fake log line\x1b[31m"); },
       absl::StatusCode::kInvalidArgument, "request_id"},
      {"past the model's room", [](auto* r) { r->set_max_tokens(600); },
       absl::StatusCode::kOutOfRange, "max_tokens"},
      {"unknown mode", [](auto* r) { SetRequestModeName("telepathy", r); },
       absl::StatusCode::kInvalidArgument, "mode"},
      {"unknown transfer_mode",
       [](auto* r) { r->set_transfer_mode(static_cast<v1::TransferMode>(42)); },
       absl::StatusCode::kInvalidArgument, "transfer_mode"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest request = Request();
    c.spoil(&request);
    const absl::Time start = absl::Now();
    Reply reply = Generate(request);
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << c.name;
    EXPECT_EQ(reply.status.code(), c.code) << c.name << ": " << reply.status;
    EXPECT_THAT(std::string(reply.status.message()), HasSubstr(c.field)) << c.name;
    EXPECT_LT(reply.status.message().size(), 400u) << c.name;  // never the client's megabytes
    EXPECT_TRUE(reply.events.empty()) << c.name << ": " << reply.events.front().DebugString();
  }
  std::map<std::string, uint64_t> stats = CoordinatorStats();
  // Only the request past the model's room reached a consumer (which refused it before Started);
  // the producer prefilled none of them.
  EXPECT_LE(stats["routed"], routed_before + 1);
  EXPECT_GE(stats["refused_out_of_range"], 8u);
  EXPECT_GE(stats["refused_invalid_argument"], 6u);

  // Nothing from the client reached the log raw: no forged line, no megabyte.
  const std::string log = testing::ReadFile(server_->log());
  EXPECT_THAT(log, Not(HasSubstr("\n[error] fake log line")));
  EXPECT_THAT(log, Not(HasSubstr("\x1b[31m")));
  EXPECT_LT(log.size(), 256u << 10);
}

TEST_F(ServingHardeningTest, ServerIdsAreRandomAndAClientsIdCollidesWithNothing) {
  Reply a = Generate(Request()), b = Generate(Request());
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
  const std::string id_a = a.events.front().started().request_id();
  const std::string id_b = b.events.front().started().request_id();
  EXPECT_EQ(id_a.size(), 32u);
  EXPECT_NE(id_a, id_b);
  // Two requests at once with the same client request_id (the "req-N" attack): both run
  // to their end (sessions are tagged with the coordinator's own ids).
  v1::GenerateRequest same = Request();
  same.set_request_id("req-280");
  same.set_max_tokens(32);
  Reply first, second;
  std::thread other([&] { first = Generate(same); });
  second = Generate(same);
  other.join();
  for (const Reply* reply : {&first, &second}) {
    ASSERT_TRUE(reply->status.ok()) << reply->status;
    ASSERT_TRUE(reply->events.back().has_finished()) << reply->events.back().DebugString();
    EXPECT_EQ(reply->events.front().started().request_id(), "req-280");
  }
}

TEST_F(ServingHardeningTest, StatusCodesSayWhatHappened) {
  // raw across different weights: served (a benchmark baseline), saying the quality is degraded.
  Reply degraded = Generate(Request("xs"));
  ASSERT_TRUE(degraded.status.ok()) << degraded.status;
  EXPECT_THAT(degraded.events.front().started().mode_reason(), HasSubstr("quality degraded"));
  EXPECT_THAT(degraded.events.back().finished().mode_reason(), HasSubstr("quality degraded"));
  Reply faithful = Generate(Request("copy"));
  ASSERT_TRUE(faithful.status.ok());
  EXPECT_EQ(faithful.events.front().started().mode_reason(), "requested");
  // Health carries the build's version.
  v1::HealthResponse health;
  ASSERT_TRUE(Health(*address_, absl::Seconds(5), &health).ok());
  EXPECT_THAT(health.version(), HasSubstr("0."));
  // An unknown target is NOT_FOUND, its name cut in the message.
  v1::GenerateRequest unknown = Request(std::string(100, 'n'));
  Reply missing = Generate(unknown);
  EXPECT_EQ(missing.status.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.status.message().size(), 400u);
}

}  // namespace
}  // namespace scd
