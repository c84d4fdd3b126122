// The three daemons as separate processes (scd-coordinator configured by a TOML file, scd-producer,
// scd-consumers) over loopback, codes over the gRPC and over the UCX transport, driven through the
// coordinator's public API with the library client: greedy scd tokens on the hard pair equal the
// batch transfer path in this process, the all-in-one server (`scd serve --all-in-one`) and
// `scd-calib generate`; raw between identical models equals local generation; 16 concurrent
// requests all complete unmixed; a fan-out to the fine-tune and the independent model runs one
// prefill (the producer's Stats) and both streams equal their references; a consumer killed with
// SIGKILL leaves routing within 3 s and its target becomes UNAVAILABLE; a producer killed before a
// request ends it in one Error within 1 s; SIGTERM drains and every daemon exits 0. Faults in the
// middle of a (shaped, slow) transfer: producer killed -> one Error within 1 s, or a local
// fallback when allowed; consumer killed -> the producer frees the session and its buffers within
// 1 s; client cancel -> both free everything (counted by their Stats) and the next request on
// that consumer is exact; with prefix caches on, a producer killed mid-prefill leaves the
// consumer's cache empty.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "codec/transfer.h"
#include "model/generator.h"
#include "proto/grpc_util.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/inference.grpc.pb.h"
#include "scd/v1/registry.grpc.pb.h"
#include "tests/cluster_client.h"
#include "tests/test_daemon.h"
#include "tests/test_util.h"

namespace scd {
namespace {

// The test's own reads of time, on the monotonic clock: its "within one second" bounds then count
// only what the processes took, not a step of the wall clock (an NTP step or a resumed VM would
// otherwise pass or fail them at random).
absl::Time SteadyNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::Bin;
using testing::Daemon;

class DaemonsProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Extra scd-producer flags (the fault tests slow its link down).
  virtual std::vector<std::string> ProducerFlags() const { return {}; }
  // Extra flags of the base-copy consumer.
  virtual std::vector<std::string> ConsumerFlags() const { return {}; }

  void SetUp() override {
    dir_ =
        fs::temp_directory_path() / ("scd-daemons-" + std::to_string(getpid()) + "-" + GetParam());
    fs::create_directories(dir_);
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    xs_ = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
    artifact_ = testing::SyntheticArtifact(*producer_);
    artifact_.consumer = testing::Ok(ModelIdentity::Of(*xs_));
    artifact_path_ = dir_ + "/pair.scd";
    ASSERT_TRUE(artifact_.Save(artifact_path_).ok());

    // The coordinator takes its settings from a TOML file (--config), as deployments do.
    testing::WriteFile(dir_ + "/coordinator.toml",
                       "# scd-coordinator\nlisten = \"127.0.0.1:0\"\nlease_ms = 2000\n");
    coordinator_ = std::make_unique<Daemon>(
        dir_, "coordinator",
        std::vector<std::string>{Bin("scd-coordinator"), "--config", dir_ + "/coordinator.toml"});
    server_ = coordinator_->Address();
    ASSERT_FALSE(server_.empty());
    control_ = coordinator_->ControlAddress();  // where the nodes register
    const std::string transport = GetParam();
    std::vector<std::string> producer_argv{
        Bin("scd-producer"), "--model",    testing::ModelDir("stories260k"),
        "--coordinator",     control_,     "--transport",
        transport,           "--artifact", artifact_path_};
    for (const std::string& flag : ProducerFlags()) producer_argv.push_back(flag);
    producer_daemon_ = std::make_unique<Daemon>(dir_, "producer", producer_argv);
    xs_daemon_ = std::make_unique<Daemon>(
        dir_, "xs",
        std::vector<std::string>{Bin("scd-consumer"), "--model", testing::ModelDir("llama2xs-260k"),
                                 "--name", "xs", "--coordinator", control_, "--transport", transport,
                                 "--artifact", artifact_path_, "--capacity", "16"});
    std::vector<std::string> copy_argv{Bin("scd-consumer"), "--model",
                                       testing::ModelDir("stories260k"), "--name",
                                       "base-copy", "--coordinator",
                                       control_, "--transport",
                                       transport, "--capacity",
                                       "16"};
    for (const std::string& flag : ConsumerFlags()) copy_argv.push_back(flag);
    copy_daemon_ = std::make_unique<Daemon>(dir_, "copy", copy_argv);
    // Registered: all three models routable.
    ASSERT_TRUE(testing::WaitForModels(*coordinator_, 3, absl::Seconds(60)))
        << "daemons did not register; logs in " << dir_;
  }
  void TearDown() override {
    if (HasFailure() || getenv("SCD_KEEP_TEST_LOGS")) return;  // keep the logs
    fs::remove_all(dir_);
  }

  struct Reply {
    absl::Status status;
    std::vector<TokenId> ids;
    std::vector<v1::GenerateEvent> events;
  };
  static v1::GenerateRequest Request(const std::vector<std::string>& targets,
                                     const std::string& mode, const std::vector<TokenId>& prompt,
                                     int max_tokens) {
    v1::GenerateRequest request;
    for (const std::string& target : targets) request.add_targets(target);
    SetRequestModeName(mode, &request);
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(max_tokens);
    return request;
  }
  // `request` on `server`; ids and events of every target together (one target: its own).
  static Reply GenerateOn(const std::string& server, const v1::GenerateRequest& request,
                          std::map<std::string, std::vector<TokenId>>* ids_by_target = nullptr) {
    Reply reply;
    reply.status = StreamGenerate(server, request, absl::Seconds(60), [&](const auto& event) {
      reply.events.push_back(event);
      for (int32_t id : event.token().ids()) {
        reply.ids.push_back(id);
        if (ids_by_target != nullptr) (*ids_by_target)[event.target()].push_back(id);
      }
    });
    return reply;
  }
  Reply Generate(const std::string& target, const std::string& mode,
                 const std::vector<TokenId>& prompt, int max_tokens) {
    return GenerateOn(server_, Request({target}, mode, prompt, max_tokens));
  }
  std::vector<TokenId> Reference(const LlamaModel& consumer, TransferMode mode,
                                 const std::vector<TokenId>& prompt, int max_tokens,
                                 const Artifact* artifact = nullptr) {
    if (artifact == nullptr) artifact = &artifact_;
    KvCache cache = consumer.NewCache(64);
    if (mode != TransferMode::kLocal) {
      TransferPath path = testing::Ok(TransferPath::Create(
          mode, *producer_, consumer, ModeNeedsArtifact(mode) ? artifact : nullptr, {}));
      const std::vector<TokenId> prefix(prompt.begin(), prompt.end() - 1);
      EXPECT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
    }
    GenerationOptions options;
    options.max_tokens = max_tokens;
    return testing::Ok(GenerateTokens(consumer, prompt, &cache, options)).output_ids;
  }

  std::string dir_, server_, control_, artifact_path_;
  std::unique_ptr<LlamaModel> producer_, xs_;
  Artifact artifact_;
  std::unique_ptr<Daemon> coordinator_, producer_daemon_, xs_daemon_, copy_daemon_;
};

std::vector<TokenId> Prompt(int i) { return testing::LoadGolden("stories260k").prompts[i].ids; }

TEST_P(DaemonsProcessTest, ScdAndRawMatchTheirReferencesAndSigtermDrains) {
  Reply scd = Generate("xs", "scd", Prompt(2), 16);
  ASSERT_TRUE(scd.status.ok()) << scd.status;
  ASSERT_TRUE(scd.events.back().has_finished()) << scd.events.back().DebugString();
  EXPECT_EQ(RanModeName(scd.events.back().finished()), "scd");
  EXPECT_EQ(scd.ids, Reference(*xs_, TransferMode::kScd, Prompt(2), 16));

  Reply raw = Generate("base-copy", "", Prompt(1), 16);  // auto: identical weights -> raw
  ASSERT_TRUE(raw.status.ok()) << raw.status;
  EXPECT_EQ(RanModeName(raw.events.front().started()), "raw");
  EXPECT_EQ(raw.ids, Reference(*producer_, TransferMode::kLocal, Prompt(1), 16));

  EXPECT_EQ(xs_daemon_->Terminate(absl::Seconds(10)), 0) << xs_daemon_->Ending();
  EXPECT_EQ(copy_daemon_->Terminate(absl::Seconds(10)), 0) << copy_daemon_->Ending();
  EXPECT_EQ(producer_daemon_->Terminate(absl::Seconds(10)), 0) << producer_daemon_->Ending();
  EXPECT_EQ(coordinator_->Terminate(absl::Seconds(10)), 0) << coordinator_->Ending();
}

TEST_P(DaemonsProcessTest, SixteenConcurrentRequestsAllCompleteUnmixed) {
  struct Case {
    std::string target, mode;
    int prompt, max_tokens;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    cases.push_back({i % 2 ? "xs" : "base-copy", i % 2 ? "scd" : "raw", i % 4, 6 + i});
  }
  std::vector<Reply> replies(cases.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < cases.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] =
          Generate(cases[i].target, cases[i].mode, Prompt(cases[i].prompt), cases[i].max_tokens);
    });
  }
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(replies[i].status.ok()) << i << ": " << replies[i].status;
    ASSERT_TRUE(replies[i].events.back().has_finished())
        << i << ": " << replies[i].events.back().DebugString();
    const bool scd = cases[i].mode == "scd";
    EXPECT_EQ(replies[i].ids,
              Reference(scd ? *xs_ : *producer_, scd ? TransferMode::kScd : TransferMode::kLocal,
                        Prompt(cases[i].prompt), cases[i].max_tokens))
        << "request " << i;
  }
}

TEST_P(DaemonsProcessTest, FanOutRunsOnePrefillAndMatchesBothSingleTargetReferences) {
  // A third consumer, the fine-tune, with its own artifact for the producer.
  auto fables = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k-fables"), {}));
  Artifact fables_artifact = testing::SyntheticArtifact(*producer_);
  fables_artifact.consumer = testing::Ok(ModelIdentity::Of(*fables));
  ASSERT_TRUE(fables_artifact.Save(dir_ + "/fables.scd").ok());
  // The producer that holds both artifacts takes over: the old one's lease lapses first (the
  // registry then holds xs and base-copy: its Stats' `running`), then the new nodes register
  // (four), so the probe below is routed to them.
  producer_daemon_->Kill(SIGKILL);
  ASSERT_EQ(producer_daemon_->Wait(absl::Seconds(10)), -1);
  auto registry_holds = [this](uint32_t nodes) {
    const v1::NodeStats registry = testing::AwaitStats<v1::Registry>(
        *coordinator_, [nodes](const v1::NodeStats& s) { return s.running() == nodes; },
        absl::Seconds(30));
    EXPECT_EQ(registry.running(), nodes) << registry.DebugString();
    return registry.running() == nodes;
  };
  ASSERT_TRUE(registry_holds(2));
  Daemon fables_daemon(
      dir_, "fables",
      {Bin("scd-consumer"), "--model", testing::ModelDir("stories260k-fables"), "--name", "fables",
       "--coordinator", control_, "--transport", GetParam(), "--artifact", dir_ + "/fables.scd"});
  Daemon producer_with_both(dir_, "producer2",
                            {Bin("scd-producer"), "--model", testing::ModelDir("stories260k"),
                             "--coordinator", control_, "--transport", GetParam(), "--artifact",
                             artifact_path_, "--artifact", dir_ + "/fables.scd"});
  const std::string producer_address = producer_with_both.Address();
  ASSERT_TRUE(registry_holds(4));
  const Reply probe = Generate("fables", "scd", Prompt(0), 2);
  ASSERT_TRUE(probe.status.ok()) << probe.status;
  ASSERT_TRUE(probe.events.back().has_finished()) << probe.events.back().DebugString();

  auto prefills = [&] {
    auto stub = v1::Producer::NewStub(
        grpc::CreateChannel(producer_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    context.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
    v1::NodeStats stats;
    EXPECT_TRUE(stub->Stats(&context, v1::StatsRequest(), &stats).ok());
    return stats.prefills();
  };
  const uint64_t before = prefills();
  std::map<std::string, std::vector<TokenId>> ids;
  Reply reply = GenerateOn(server_, Request({"fables", "xs"}, "scd", Prompt(3), 16), &ids);
  ASSERT_TRUE(reply.status.ok()) << reply.status;
  EXPECT_EQ(prefills(), before + 1);
  EXPECT_EQ(ids["fables"], Reference(*fables, TransferMode::kScd, Prompt(3), 16, &fables_artifact));
  EXPECT_EQ(ids["xs"], Reference(*xs_, TransferMode::kScd, Prompt(3), 16));
}

TEST_P(DaemonsProcessTest, TheAllInOneServerAndScdCalibGenerateGiveTheSameTokens) {
  Daemon all_in_one(
      dir_, "all-in-one",
      {Bin("scd"), "serve", "--all-in-one", "--producer-model", testing::ModelDir("stories260k"),
       "--consumer", "xs=" + testing::ModelDir("llama2xs-260k") + ":" + artifact_path_, "--listen",
       "127.0.0.1:0"});
  const std::string embedded = all_in_one.Address();
  ASSERT_FALSE(embedded.empty());
  v1::GenerateRequest request = Request({"xs"}, "scd", {}, 24);
  request.set_prompt("Once upon a time, a little fox");
  Reply routed = GenerateOn(server_, request);
  Reply local = GenerateOn(embedded, request);
  ASSERT_TRUE(routed.status.ok()) << routed.status;
  ASSERT_TRUE(local.status.ok()) << local.status;
  ASSERT_TRUE(routed.events.back().has_finished()) << routed.events.back().DebugString();
  EXPECT_EQ(RanModeName(routed.events.back().finished()), "scd");
  EXPECT_EQ(RanModeName(local.events.back().finished()), "scd");
  EXPECT_EQ(routed.ids, local.ids);

  // scd-calib generate, same pair, artifact, mode and prompt: the same text.
  std::string text;
  for (const auto& event : routed.events) text += event.token().text();
  const testing::CommandResult calib = testing::RunCommand(
      Bin("scd-calib") + " generate --producer " + testing::ModelDir("stories260k") +
      " --consumer " + testing::ModelDir("llama2xs-260k") + " --artifact " + artifact_path_ +
      " --mode scd --max-tokens 24 --prompt 'Once upon a time, a little fox'");
  ASSERT_EQ(calib.exit_code, 0) << calib.err;
  const std::string marker = "from a scd transfer";
  const size_t block = calib.out.find(marker);
  ASSERT_NE(block, std::string::npos) << calib.out;
  const size_t begin = calib.out.find('\n', block) + 1;
  // It prints the prompt, then the continuation.
  const std::string expected = request.prompt() + text;
  EXPECT_EQ(calib.out.substr(begin, expected.size()), expected) << calib.out;

  // The command-line client streams the same text, its TTFT breakdown on stderr; --json prints
  // every event as one JSON line (Started, the deltas, Finished).
  const std::string client = Bin("scd") + " generate --server " + embedded +
                             " --target xs --mode scd --max-tokens 24 --prompt '" +
                             request.prompt() + "'";
  const testing::CommandResult streamed = testing::RunCommand(client + " --stats");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, text + "\n");
  EXPECT_THAT(streamed.err, HasSubstr("[xs] mode scd"));
  EXPECT_THAT(streamed.err, HasSubstr("payload bytes; ttft"));
  const testing::CommandResult json = testing::RunCommand(client + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'),
            static_cast<long>(local.events.size()));
  EXPECT_THAT(json.out, HasSubstr("\"started\""));
  EXPECT_THAT(json.out, HasSubstr("\"finished\""));
}

// The bandwidth sweep's knob (issue 16): Registry.SetLinkShape on the coordinator's control plane
// reaches the producer daemon at run time; the next request's codes travel under the new shape
// (Finished.link says so, and the transfer takes at least bytes / rate); a read-only call reports
// it; bad calls are refused whole.
TEST_P(DaemonsProcessTest, LinkShapeSetThroughTheCoordinatorShapesTheNextRequest) {
  auto registry = v1::Registry::NewStub(
      grpc::CreateChannel(control_, grpc::InsecureChannelCredentials()));
  auto set = [&](const v1::SetLinkShapeRequest& request, v1::SetLinkShapeResponse* response,
                 const char* secret = testing::kTestClusterSecret) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    context.AddMetadata("x-scd-cluster-secret", secret);
    return registry->SetLinkShape(&context, request, response);
  };
  v1::SetLinkShapeRequest request;
  request.mutable_shape()->set_gbps(0.02);  // 2.5 MB/s
  request.mutable_shape()->set_latency_us(2000);
  v1::SetLinkShapeResponse response;
  grpc::Status status = set(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.producers_size(), 1);
  EXPECT_EQ(response.producers(0).name(), "stories260k");
  EXPECT_EQ(response.producers(0).code(), 0) << response.producers(0).message();
  EXPECT_EQ(response.producers(0).shape().gbps(), 0.02);
  EXPECT_EQ(response.producers(0).shape().latency_us(), 2000);

  // A long prompt: its raw cache (~500 KB) is well past the shaper's 64 KiB burst.
  std::vector<TokenId> prompt;
  for (int i = 0; i < 400; ++i) prompt.push_back(static_cast<TokenId>(5 + (i * 37) % 500));
  Reply shaped = Generate("base-copy", "raw", prompt, 4);
  ASSERT_TRUE(shaped.status.ok()) << shaped.status;
  ASSERT_TRUE(shaped.events.back().has_finished()) << shaped.events.back().DebugString();
  const v1::Finished& f = shaped.events.back().finished();
  EXPECT_EQ(f.link().gbps(), 0.02);
  EXPECT_EQ(f.link().latency_us(), 2000);
  // bytes / rate, less the shaper's 64 KiB burst, plus the one-way latency is a lower bound on
  // the time to the first token (the transfer timing starts at the first chunk's arrival).
  const double floor_us =
      (static_cast<double>(f.payload_bytes()) - 65536) * 8 / (0.02 * 1e9) * 1e6 + 2000;
  EXPECT_GE(static_cast<double>(f.timings().ttft()), floor_us) << f.DebugString();
  EXPECT_GT(f.payload_bytes(), 65536u * 3);

  // Read only: no shape in the request.
  v1::SetLinkShapeResponse read;
  ASSERT_TRUE(set(v1::SetLinkShapeRequest(), &read).ok());
  ASSERT_EQ(read.producers_size(), 1);
  EXPECT_EQ(read.producers(0).shape().gbps(), 0.02);

  // Refused whole: a rate out of bounds, an unknown producer, no secret.
  v1::SetLinkShapeRequest bad;
  bad.mutable_shape()->set_gbps(-1);
  v1::SetLinkShapeResponse ignored;
  status = set(bad, &ignored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("gbps"));
  v1::SetLinkShapeRequest unknown;
  unknown.set_producer("no-such-producer");
  EXPECT_EQ(set(unknown, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(set(request, &ignored, "wrong-secret-0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Back to unshaped, by the producer's name: the next request records no shape.
  v1::SetLinkShapeRequest clear;
  clear.mutable_shape();
  clear.set_producer("stories260k");
  ASSERT_TRUE(set(clear, &response).ok());
  Reply plain = Generate("base-copy", "raw", prompt, 4);
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  EXPECT_FALSE(plain.events.back().finished().has_link());
  EXPECT_EQ(plain.ids, shaped.ids);
}

// Dummy weights at a real config's shapes (issue 16): scd-calib synth writes the pair's artifact
// for the daemons' default seeds; the all-in-one server serves token-id prompts in scd mode and
// refuses a text prompt (no tokenizer beside a bare config), naming prompt_ids.
TEST(DummyWeightsServingTest, AllInOneServesIdsOnARealConfigAndRefusesText) {
  testing::TempDir temp;
  const std::string dir = temp.path();
  const std::string config = testing::SharedDir() + "/configs/smollm2-135m.json";
  const testing::CommandResult synth = testing::RunCommand(
      Bin("scd-calib") + " synth --producer " + config + " --consumer " + config +
      " --layers 2 --patch-layers 1 --out " + dir + "/pair.scd");
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  Daemon server(dir, "all-in-one",
                {Bin("scd"), "serve", "--all-in-one", "--dummy-weights", config, "--layers", "2",
                 "--consumer", "b=" + config + ":" + dir + "/pair.scd", "--listen", "127.0.0.1:0",
                 "--memory-trim-seconds", "0.1", "--malloc-arenas", "2", "--log-level", "info"});
  const std::string address = server.Address(absl::Seconds(120));
  ASSERT_FALSE(address.empty());
  v1::GenerateRequest request;
  request.add_targets("b");
  SetRequestModeName("scd", &request);
  request.set_max_tokens(6);
  request.set_logprobs(2);
  for (int i = 0; i < 40; ++i) request.add_prompt_ids(100 + 37 * i);
  std::vector<v1::GenerateEvent> events;
  absl::Status status = StreamGenerate(address, request, absl::Seconds(60),
                                       [&](const v1::GenerateEvent& e) { events.push_back(e); });
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_FALSE(events.empty());
  ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
  EXPECT_EQ(RanModeName(events.back().finished()), "scd");
  EXPECT_EQ(events.back().finished().prompt_tokens(), 40u);
  EXPECT_GT(events.back().finished().payload_bytes(), 0u);
  int positions = 0;
  for (const v1::GenerateEvent& e : events) {
    if (!e.has_token()) continue;
    EXPECT_EQ(e.token().text(), "");
    for (int i = 0; i < e.token().ids_size(); ++i, ++positions) {
      ASSERT_EQ(e.token().logprobs(i).top_size(), 2);
      EXPECT_EQ(e.token().logprobs(i).top(0).id(), e.token().ids(i));
    }
  }
  EXPECT_EQ(static_cast<uint32_t>(positions), events.back().finished().output_tokens());

  v1::GenerateRequest text;
  text.add_targets("b");
  text.set_prompt("Once upon a time");
  status = StreamGenerate(address, text, absl::Seconds(30), [](const v1::GenerateEvent&) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("prompt_ids"));
  EXPECT_EQ(server.Terminate(absl::Seconds(30)), 0) << server.Ending();
  // Its memory is looked after as each daemon's is (tools/tool_common.h MemoryFlags).
  EXPECT_THAT(testing::ReadFile(server.log()), ::testing::ContainsRegex("in [1-9][0-9]* trims"));
}

TEST_P(DaemonsProcessTest, KilledConsumerLeavesRoutingWithinThreeSeconds) {
  copy_daemon_->Kill(SIGKILL);
  ASSERT_TRUE(testing::WaitForModels(*coordinator_, 2, absl::Seconds(3)))
      << "still routed after 3 s";
  // Known, but no live node: UNAVAILABLE (retry later); a name never served stays NOT_FOUND.
  Reply gone = Generate("base-copy", "", Prompt(1), 4);
  EXPECT_EQ(gone.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(gone.status.message()), HasSubstr("no live consumer"));
  Reply never = Generate("never-served", "", Prompt(1), 4);
  EXPECT_EQ(never.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(never.status.message()), HasSubstr("known targets: xs"));
}

// A dead producer: a request that forbids the fallback ends in one Error at once, and its failed
// Prefill takes the producer out of the coordinator's routing (coordinator/node_ejection.h); then
// a request that allows it (the default since issue 50: a producer's death ends no request a
// consumer can finish) is routed to local prefill, saying why, with local prefill's tokens; one
// that forbids it is refused at once, as no producer is live.
TEST_P(DaemonsProcessTest, DeadProducerFallsBackOrEndsTheRequestInOneErrorWithinOneSecond) {
  producer_daemon_->Kill(SIGKILL);  // its lease lasts seconds: the coordinator learns by calling
  ASSERT_EQ(producer_daemon_->Wait(absl::Seconds(10)), -1);  // dead (reaped), sockets closed
  v1::GenerateRequest forbidding = Request({"xs"}, "scd", Prompt(2), 16);
  forbidding.set_allow_local_fallback(false);
  const absl::Time start = SteadyNow();
  Reply reply = GenerateOn(server_, forbidding);
  EXPECT_LT(SteadyNow() - start, absl::Seconds(1));
  ASSERT_TRUE(reply.status.ok()) << reply.status;
  ASSERT_TRUE(reply.events.back().has_error()) << reply.events.back().DebugString();
  EXPECT_THAT(reply.events.back().error().message(), HasSubstr("producer"));
  int terminal = 0;
  for (const auto& e : reply.events) terminal += e.has_finished() || e.has_error();
  EXPECT_EQ(terminal, 1);

  Reply fallback = Generate("xs", "scd", Prompt(2), 16);
  ASSERT_TRUE(fallback.status.ok()) << fallback.status;
  ASSERT_TRUE(fallback.events.back().has_finished()) << fallback.events.back().DebugString();
  EXPECT_EQ(RanModeName(fallback.events.back().finished()), "local");
  EXPECT_THAT(fallback.events.back().finished().mode_reason(), HasSubstr("no live producer"));
  EXPECT_EQ(fallback.ids, Reference(*xs_, TransferMode::kLocal, Prompt(2), 16));

  Reply refused = GenerateOn(server_, forbidding);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_THAT(std::string(refused.status.message()), HasSubstr("none is live"));
  EXPECT_TRUE(refused.events.empty());
}

INSTANTIATE_TEST_SUITE_P(Transports, DaemonsProcessTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

// Faults in the middle of a transfer: the producer's link is shaped to 250 kbit/s, so a long raw
// prompt's codes (288 KB) take 9 s to arrive and there is time to kill or cancel while they travel.
// Every test here interrupts the transfer, so the slow link costs no test time; at 1 Mbit/s a
// machine slowed 3x by other load let the transfer finish before the fault could land.
// What is held is read from outside the processes, through each node's Stats.
class DaemonsFaultTest : public DaemonsProcessTest {
 protected:
  static constexpr double kLinkGbps = 0.00025;
  std::vector<std::string> ProducerFlags() const override {
    return {"--link-gbps", absl::StrCat(kLinkGbps)};
  }

  v1::NodeStats ProducerStats() { return testing::StatsOf<v1::Producer>(*producer_daemon_); }
  v1::NodeStats CopyStats() { return testing::StatsOf<v1::Consumer>(*copy_daemon_); }
  using Holds = std::function<bool(const v1::NodeStats&)>;
  // The node's Stats once `holds` them (a long poll on its changes) or when `timeout` is over.
  v1::NodeStats AwaitProducer(const Holds& holds, absl::Duration timeout) {
    return testing::AwaitStats<v1::Producer>(*producer_daemon_, holds, timeout);
  }
  v1::NodeStats AwaitCopy(const Holds& holds, absl::Duration timeout) {
    return testing::AwaitStats<v1::Consumer>(*copy_daemon_, holds, timeout);
  }
  // How many of the node's requests or sessions ended as `outcome` (0 when none did).
  static uint64_t Ended(const v1::NodeStats& s, const std::string& outcome) {
    const auto it = s.ended().find(outcome);
    return it == s.ended().end() ? 0 : it->second;
  }
  static bool ConsumerFree(const v1::NodeStats& s) {
    return s.running() == 0 && s.open_sessions() == 0;
  }
  static bool ProducerFree(const v1::NodeStats& s) {
    return s.open_sessions() == 0 && s.held_payload_bytes() == 0 && s.running() == 0;
  }
  // What is left of `limit` after `since`.
  static absl::Duration Left(absl::Time since, absl::Duration limit) {
    return since + limit - SteadyNow();
  }

  // A prompt whose raw transfer takes seconds on the shaped link.
  static std::vector<TokenId> LongPrompt() {
    std::vector<TokenId> prompt;
    while (prompt.size() < 450) {
      for (TokenId id : Prompt(2)) prompt.push_back(id);
    }
    prompt.resize(450);
    return prompt;
  }

  // A Generate running on its own thread, its events collected as they come.
  class Call {
   public:
    Call(const std::string& server, v1::GenerateRequest request) {
      stub_ =
          v1::Inference::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
      context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      thread_ = std::thread([this, request] {
        auto reader = stub_->Generate(&context_, request);
        v1::GenerateEvent event;
        while (reader->Read(&event)) {
          absl::MutexLock lock(&mu_);
          if (event.has_finished() || event.has_error()) terminal_at_ = SteadyNow();
          events_.push_back(event);
        }
        const grpc::Status status = reader->Finish();
        absl::MutexLock lock(&mu_);
        status_ = FromGrpcStatus(status);
        done_ = true;
      });
    }
    ~Call() {
      context_.TryCancel();
      thread_.join();
    }
    void Cancel() { context_.TryCancel(); }
    // Waits until `ready` holds for the events so far (false after `timeout`).
    bool WaitFor(std::function<bool(const std::vector<v1::GenerateEvent>&)> ready,
                 absl::Duration timeout) {
      absl::MutexLock lock(&mu_);
      auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || ready(events_); };
      return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout) && ready(events_);
    }
    bool WaitDone(absl::Duration timeout) {
      absl::MutexLock lock(&mu_);
      return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
    }
    std::vector<v1::GenerateEvent> events() {
      absl::MutexLock lock(&mu_);
      return events_;
    }
    absl::Time terminal_at() {
      absl::MutexLock lock(&mu_);
      return terminal_at_;
    }
    absl::Status status() {
      absl::MutexLock lock(&mu_);
      return status_;
    }

   private:
    std::unique_ptr<v1::Inference::Stub> stub_;
    grpc::ClientContext context_;
    absl::Mutex mu_;
    std::vector<v1::GenerateEvent> events_ ABSL_GUARDED_BY(mu_);
    absl::Time terminal_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
    absl::Status status_ ABSL_GUARDED_BY(mu_);
    bool done_ ABSL_GUARDED_BY(mu_) = false;
    std::thread thread_;
  };

  v1::GenerateRequest LongRawRequest(bool allow_local_fallback = false) {
    v1::GenerateRequest request;
    request.add_targets("base-copy");
    for (TokenId id : LongPrompt()) request.add_prompt_ids(id);
    request.set_max_tokens(8);
    request.set_allow_local_fallback(allow_local_fallback);
    return request;
  }

  // Started, and the producer is streaming (a session open, code bytes held by the transport);
  // checks the transfer would still take long enough for the fault to land in its middle.
  void WaitUntilTransferring(Call& call) {
    ASSERT_TRUE(
        call.WaitFor([](const auto& events) { return !events.empty(); }, absl::Seconds(30)));
    const v1::GenerateEvent first = call.events().front();
    ASSERT_TRUE(first.has_started()) << first.DebugString();
    ASSERT_EQ(RanModeName(first.started()), "raw");
    // Woken by the session's opening and by each buffer the link lets go of.
    const v1::NodeStats stats = AwaitProducer(
        [](const v1::NodeStats& s) { return s.open_sessions() > 0 && SecondsOnLink(s) > 1.0; },
        absl::Seconds(10));
    ASSERT_GT(stats.open_sessions(), 0u) << "no transfer in progress";
    ASSERT_GT(SecondsOnLink(stats), 1.0) << stats.DebugString() << " (the fault would land late)";
  }

  // How long the code bytes the producer still holds take on the shaped link.
  static double SecondsOnLink(const v1::NodeStats& stats) {
    return static_cast<double>(stats.held_payload_bytes()) * 8 / (kLinkGbps * 1e9);
  }

  static int Terminals(const std::vector<v1::GenerateEvent>& events) {
    int terminal = 0;
    for (const auto& e : events) terminal += e.has_finished() || e.has_error();
    return terminal;
  }

  // The call (LongRawRequest with the fallback allowed) ends in one Finished, mode local with a
  // fallback reason, and its tokens are the consumer's own greedy continuation.
  void ExpectLocalFallback(Call& call) {
    ASSERT_TRUE(call.WaitDone(absl::Seconds(30)));
    const std::vector<v1::GenerateEvent> events = call.events();
    ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
    EXPECT_EQ(Terminals(events), 1);
    EXPECT_EQ(RanModeName(events.back().finished()), "local");
    EXPECT_THAT(events.back().finished().mode_reason(), HasSubstr("fallback"));
    std::vector<TokenId> ids;
    for (const auto& e : events)
      ids.insert(ids.end(), e.token().ids().begin(), e.token().ids().end());
    EXPECT_EQ(ids, Reference(*producer_, TransferMode::kLocal, LongPrompt(), 8));
  }
};

TEST_P(DaemonsFaultTest, ProducerKilledMidTransferEndsInOneErrorWithinOneSecond) {
  Call call(server_, LongRawRequest());
  WaitUntilTransferring(call);
  producer_daemon_->Kill(SIGKILL);
  const absl::Time killed = SteadyNow();
  ASSERT_TRUE(call.WaitDone(absl::Seconds(10)));
  EXPECT_LT(call.terminal_at() - killed, absl::Seconds(1));
  const std::vector<v1::GenerateEvent> events = call.events();
  ASSERT_TRUE(events.back().has_error()) << events.back().DebugString();
  EXPECT_EQ(Terminals(events), 1);
  // The consumer frees the request within the same second: nothing admitted, no session open.
  // (The coordinator writes the Error as it cancels the consumer's call; the consumer frees it
  // when the cancel reaches it, so the client may hear the end first.)
  const v1::NodeStats consumer = AwaitCopy(ConsumerFree, Left(killed, absl::Seconds(1)));
  EXPECT_TRUE(ConsumerFree(consumer)) << "still held after 1 s: " << consumer.DebugString();
}

TEST_P(DaemonsFaultTest, ProducerKilledMidTransferFallsBackToLocalWhenAllowed) {
  Call call(server_, LongRawRequest(/*allow_local_fallback=*/true));
  WaitUntilTransferring(call);
  producer_daemon_->Kill(SIGKILL);
  ExpectLocalFallback(call);
}

TEST_P(DaemonsFaultTest, ConsumerKilledMidTransferFreesTheProducersSessionWithinOneSecond) {
  Call call(server_, LongRawRequest());
  WaitUntilTransferring(call);
  // The session ends peer lost (the link saw the consumer go) or cancelled (the coordinator saw
  // it first and called the Prefill off).
  auto lost = [](const v1::NodeStats& s) { return Ended(s, "peer_lost") + Ended(s, "cancelled"); };
  const uint64_t lost_before = lost(ProducerStats());
  copy_daemon_->Kill(SIGKILL);
  const absl::Time killed = SteadyNow();
  const v1::NodeStats stats = AwaitProducer(ProducerFree, Left(killed, absl::Seconds(1)));
  EXPECT_TRUE(ProducerFree(stats)) << "still held after 1 s: " << stats.DebugString();
  EXPECT_GT(lost(stats), lost_before) << stats.DebugString();
  ASSERT_TRUE(call.WaitDone(absl::Seconds(10)));
  const std::vector<v1::GenerateEvent> events = call.events();
  ASSERT_TRUE(events.back().has_error()) << events.back().DebugString();
  EXPECT_EQ(Terminals(events), 1);
}

TEST_P(DaemonsFaultTest, ClientCancelMidTransferFreesEverythingAndTheNextRequestIsExact) {
  {
    Call call(server_, LongRawRequest());
    WaitUntilTransferring(call);
    call.Cancel();
    const absl::Time cancelled = SteadyNow();
    const v1::NodeStats producer = AwaitProducer(ProducerFree, Left(cancelled, absl::Seconds(1)));
    const v1::NodeStats consumer = AwaitCopy(ConsumerFree, Left(cancelled, absl::Seconds(1)));
    ASSERT_TRUE(ProducerFree(producer) && ConsumerFree(consumer))
        << "still held after 1 s:\n"
        << producer.DebugString() << consumer.DebugString();
    // Cancelled on both nodes, whichever cancel reached the consumer first: the coordinator's or
    // the producer's (its Prefill is a child of the client's call), which is no producer loss to
    // ask a takeover for (consumer/target_events.h ProducerLost).
    EXPECT_EQ(Ended(producer, "cancelled"), 1u) << producer.DebugString();
    EXPECT_EQ(Ended(consumer, "request_cancelled"), 1u) << consumer.DebugString();
    EXPECT_EQ(Ended(producer, "completed"), 0u);
  }
  // The same consumer, next request: exactly its local reference (raw between identical weights),
  // so nothing of the cancelled transfer reached its cache.
  Reply next = Generate("base-copy", "", Prompt(1), 16);
  ASSERT_TRUE(next.status.ok()) << next.status;
  ASSERT_TRUE(next.events.back().has_finished()) << next.events.back().DebugString();
  EXPECT_EQ(RanModeName(next.events.back().finished()), "raw");
  EXPECT_EQ(next.ids, Reference(*producer_, TransferMode::kLocal, Prompt(1), 16));
  EXPECT_EQ(ProducerStats().ended().at("completed"), 1u);
}

INSTANTIATE_TEST_SUITE_P(Transports, DaemonsFaultTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

// The shared-prefix code cache (issue 17) across real processes: both nodes keep prefix caches.
// A producer whose frames reach the consumer only after a long one-way latency: its session is
// open on its side (its codes held) while the consumer has not heard of it yet.
class DaemonsSlowLinkFaultTest : public DaemonsFaultTest {
 protected:
  static constexpr int kLatencyUs = 4'000'000;  // longer than the coordinator's grace (2 s)
  std::vector<std::string> ProducerFlags() const override {
    std::vector<std::string> flags = DaemonsFaultTest::ProducerFlags();
    flags.insert(flags.end(), {"--link-latency-us", absl::StrCat(kLatencyUs)});
    return flags;
  }
};

// The producer dies before its session's header reached the consumer (the CI run of 2026-11-25
// hit this by timing: the kill landed while the first transfer link was still being set up). The
// consumer cannot tell a producer that never sends from one that is slow; the coordinator can
// (its Prefill call failed) and tells it (Consumer.TransferFailed): the request falls back to the
// consumer's own prefill at once, instead of being cancelled after the grace period as a consumer
// that never answered.
TEST_P(DaemonsSlowLinkFaultTest, ProducerKilledBeforeTheSessionArrivesFallsBackToLocal) {
  Call call(server_, LongRawRequest(/*allow_local_fallback=*/true));
  WaitUntilTransferring(call);
  ASSERT_EQ(CopyStats().open_sessions(), 0u) << "the session reached the consumer already";
  producer_daemon_->Kill(SIGKILL);
  const absl::Time killed = SteadyNow();
  ExpectLocalFallback(call);
  EXPECT_THAT(call.events().back().finished().mode_reason(), HasSubstr("producer stories260k"));
  // Told, not timed out: well within the transfer timeout the consumer would otherwise wait.
  EXPECT_LT(call.terminal_at() - killed, absl::Seconds(10));
}

INSTANTIATE_TEST_SUITE_P(Transports, DaemonsSlowLinkFaultTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

class DaemonsPrefixCacheFaultTest : public DaemonsFaultTest {
 protected:
  std::vector<std::string> ProducerFlags() const override {
    std::vector<std::string> flags = DaemonsFaultTest::ProducerFlags();
    flags.insert(flags.end(), {"--prefix-cache-mb", "64"});
    return flags;
  }
  std::vector<std::string> ConsumerFlags() const override { return {"--prefix-cache-mb", "64"}; }
};

// A producer SIGKILLed while the prompt's prefill is still reaching the consumer (its codes on the
// slow link, the consumer's cache half rebuilt) leaves no prefix entry on the consumer: the
// request ends in one Error, the consumer frees it, and its cache holds nothing. The same prompt
// served whole afterwards (local, on the same consumer) is stored: the cache was on all along.
TEST_P(DaemonsPrefixCacheFaultTest, ProducerKilledMidPrefillLeavesNoConsumerEntry) {
  ASSERT_TRUE(CopyStats().has_prefix_cache());
  Call call(server_, LongRawRequest());
  WaitUntilTransferring(call);
  producer_daemon_->Kill(SIGKILL);
  const absl::Time killed = SteadyNow();
  ASSERT_TRUE(call.WaitDone(absl::Seconds(10)));
  const std::vector<v1::GenerateEvent> events = call.events();
  ASSERT_TRUE(events.back().has_error()) << events.back().DebugString();
  EXPECT_EQ(Terminals(events), 1);
  const v1::NodeStats consumer = AwaitCopy(ConsumerFree, Left(killed, absl::Seconds(5)));
  ASSERT_TRUE(ConsumerFree(consumer)) << "still held after 5 s: " << consumer.DebugString();
  EXPECT_EQ(consumer.prefix_cache().entries(), 0u) << consumer.DebugString();
  EXPECT_EQ(consumer.prefix_cache().bytes(), 0u);
  EXPECT_EQ(consumer.prefix_cache().hits(), 0u);

  Reply local = Generate("base-copy", "local", LongPrompt(), 2);
  ASSERT_TRUE(local.status.ok()) << local.status;
  ASSERT_TRUE(local.events.back().has_finished()) << local.events.back().DebugString();
  EXPECT_EQ(local.events.back().finished().consumer_cached_tokens(), 0u);
  EXPECT_EQ(CopyStats().prefix_cache().entries(), LongPrompt().size() / 16);
}

INSTANTIATE_TEST_SUITE_P(Transports, DaemonsPrefixCacheFaultTest, ::testing::Values("grpc"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace scd
