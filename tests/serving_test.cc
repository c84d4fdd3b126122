// The serving path in one process, every hop real: a coordinator, a producer and consumers, each a
// gRPC server on loopback, codes over the gRPC transport. Through the coordinator's public
// Inference API: greedy tokens equal the batch transfer path (whole batch, batch decoder,
// GenerateTokens: what `scd-calib generate` runs) for the same pair and mode; raw between
// identical models equals the consumer's local generation; a fan-out to two consumers runs one
// prefill and both streams match their single-target references; 16 concurrent requests all
// complete, none mixed up; a full consumer refuses before anything is prefilled or sent; a request
// cancelled mid-transfer leaves the next one on that consumer exact; 1-token and maximum-length
// prompts complete (one more token is OUT_OF_RANGE); unknown targets are NOT_FOUND naming the
// known ones.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "codec/fingerprint.h"
#include "codec/transfer.h"
#include "consumer/decode_service.h"
#include "consumer/inference_service.h"
#include "coordinator/coordinator_service.h"
#include "model/generator.h"
#include "producer/producer_service.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<grpc::Server> Serve(std::vector<grpc::Service*> services, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

std::unique_ptr<transport::Transport> GrpcTransport() {
  transport::TransportOptions options;
  options.backend = "grpc";
  return testing::Ok(transport::CreateTransport(options));
}

struct ConsumerNode {
  std::string name;
  std::unique_ptr<LlamaModel> model;
  std::string fingerprint;
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<consumer::SessionRouter> router;
  std::shared_ptr<consumer::Admission> admission;
  std::unique_ptr<consumer::ConsumerControlService> control;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

class ServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    producer_fp_ = testing::Ok(FingerprintModel(*producer_));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
    AddConsumer("xs", "llama2xs-260k", true);
    AddConsumer("fables", "stories260k-fables", true);
    AddConsumer("base-copy", "stories260k", false);

    producer_transport_ = GrpcTransport();
    producer::ProducerModel model{producer_.get(),  tokenizer_.get(),  "stories260k",
                                  producer_fp_,     TransferOptions(), {},
                                  absl::Seconds(30)};
    for (auto& [id, artifact] : artifacts_) model.artifacts[id] = &artifact;
    producer_service_ =
        std::make_unique<producer::ProducerControlService>(model, producer_transport_.get());
    std::string producer_address;
    producer_server_ = Serve({producer_service_.get()}, &producer_address);
    v1::RegisterRequest producer;
    producer.set_role(v1::NODE_ROLE_PRODUCER);
    producer.set_address(producer_address);
    auto* entry = producer.add_models();
    entry->set_name("stories260k");
    entry->set_fingerprint(producer_fp_);
    ASSERT_TRUE(registry_.Register(producer).ok());

    coordinator_ = std::make_unique<coordinator::CoordinatorInferenceService>(&registry_);
    std::string coordinator_address;
    coordinator_server_ = Serve({coordinator_.get()}, &coordinator_address);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(coordinator_address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    coordinator_server_->Shutdown();
    producer_server_->Shutdown();
    for (auto& [name, node] : consumers_) node->server->Shutdown();
  }

  void AddConsumer(const std::string& name, const std::string& dir, bool with_artifact) {
    auto node = std::make_unique<ConsumerNode>();
    node->name = name;
    node->model = testing::Ok(LlamaModel::Load(testing::ModelDir(dir), {}));
    node->fingerprint = testing::Ok(FingerprintModel(*node->model));
    std::map<std::string, const Artifact*> held;
    v1::RegisterRequest request;
    if (with_artifact) {
      Artifact artifact = testing::SyntheticArtifact(*producer_);
      artifact.consumer = testing::Ok(ModelIdentity::Of(*node->model));
      const std::string id = "art-" + name;
      artifacts_[id] = std::move(artifact);
      held[id] = &artifacts_[id];
      auto* entry = request.add_artifacts();
      entry->set_id(id);
      entry->set_producer_fingerprint(producer_fp_);
      entry->set_consumer_fingerprint(node->fingerprint);
    }
    node->transport = GrpcTransport();
    node->router =
        std::make_unique<consumer::SessionRouter>(std::make_unique<transport::SessionAcceptor>(
            testing::Ok(node->transport->Listen("127.0.0.1:0")), transport::ConnectionOptions()));
    consumer::ConsumerModel model{node->model.get(), tokenizer_.get(), name, TransferOptions(), 16,
                                  absl::Seconds(30)};
    node->admission = consumer::Admission::Create(16);
    node->control = std::make_unique<consumer::ConsumerControlService>(model, held, node->admission,
                                                                       node->router.get());
    node->server = Serve({node->control.get()}, &node->address);
    request.set_role(v1::NODE_ROLE_CONSUMER);
    request.set_address(node->address);
    request.set_transfer_address(node->router->address());
    auto* entry = request.add_models();
    entry->set_name(name);
    entry->set_fingerprint(node->fingerprint);
    ASSERT_TRUE(registry_.Register(request).ok());
    consumers_[name] = std::move(node);
  }

  // Greedy continuation of `prompt` on consumer `name` via the batch path.
  std::vector<TokenId> Reference(const std::string& name, TransferMode mode,
                                 const std::vector<TokenId>& prompt, int max_tokens) {
    const LlamaModel& model = *consumers_[name]->model;
    KvCache cache = model.NewCache(64);
    if (mode != TransferMode::kLocal) {
      const Artifact* artifact = ModeNeedsArtifact(mode) ? &artifacts_["art-" + name] : nullptr;
      TransferPath path =
          testing::Ok(TransferPath::Create(mode, *producer_, model, artifact, TransferOptions()));
      const std::vector<TokenId> prefix(prompt.begin(), prompt.end() - 1);
      EXPECT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
    }
    GenerationOptions options;
    options.max_tokens = max_tokens;
    return testing::Ok(GenerateTokens(model, prompt, &cache, options)).output_ids;
  }

  struct Reply {
    grpc::Status status;
    std::map<std::string, std::vector<TokenId>> ids;
    std::map<std::string, std::vector<v1::GenerateEvent>> events;
  };
  Reply Generate(const std::vector<std::string>& targets, const std::string& mode,
                 const std::vector<TokenId>& prompt, int max_tokens) {
    v1::GenerateRequest request;
    for (const auto& t : targets) request.add_targets(t);
    request.set_mode(mode);
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(max_tokens);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&context, request);
    Reply reply;
    v1::GenerateEvent event;
    while (reader->Read(&event)) {
      reply.events[event.target()].push_back(event);
      if (event.has_token()) {
        for (int32_t id : event.token().ids()) reply.ids[event.target()].push_back(id);
      }
    }
    reply.status = reader->Finish();
    for (const auto& [target, events] : reply.events) {
      int terminal = 0;
      for (const auto& e : events) terminal += e.has_finished() || e.has_error();
      EXPECT_EQ(terminal, 1) << target;
      // Started first, unless refused before it (then the Error is the only event).
      EXPECT_TRUE(events.front().has_started() || (events.size() == 1 && events[0].has_error()))
          << target << ": " << events.front().DebugString();
    }
    return reply;
  }

  std::unique_ptr<LlamaModel> producer_;
  std::string producer_fp_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<std::string, Artifact> artifacts_;
  std::map<std::string, std::unique_ptr<ConsumerNode>> consumers_;
  coordinator::NodeRegistry registry_{coordinator::RegistryOptions{absl::Seconds(3600)}};
  std::unique_ptr<transport::Transport> producer_transport_;
  std::unique_ptr<producer::ProducerControlService> producer_service_;
  std::unique_ptr<grpc::Server> producer_server_;
  std::unique_ptr<coordinator::CoordinatorInferenceService> coordinator_;
  std::unique_ptr<grpc::Server> coordinator_server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

std::vector<TokenId> Prompt(int i) { return testing::LoadGolden("stories260k").prompts[i].ids; }

TEST_F(ServingTest, ScdThroughTheCoordinatorEqualsTheBatchTransferPath) {
  Reply reply = Generate({"xs"}, "scd", Prompt(2), 16);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const auto& events = reply.events["xs"];
  ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
  EXPECT_EQ(events.front().started().mode(), "scd");
  EXPECT_EQ(events.back().finished().mode(), "scd");
  EXPECT_GT(events.back().finished().payload_bytes(), 0u);
  EXPECT_EQ(events.front().started().expected_payload_bytes(),
            events.back().finished().payload_bytes());
  const v1::Timings& t = events.back().finished().timings();
  EXPECT_LE(t.last_rebuild(), t.rebuild());
  EXPECT_GT(t.patch(), 0u);  // the synthetic artifact has patch layers
  EXPECT_LE(t.patch(), t.rebuild());
  EXPECT_GT(t.prefill(), 0u);  // the producer's, filled in by the coordinator
  EXPECT_GT(t.rebuild(), 0u);
  EXPECT_GT(t.ttft(), 0u);
  EXPECT_GE(t.total(), t.ttft());
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16));
}

TEST_F(ServingTest, RawBetweenIdenticalModelsEqualsLocalGeneration) {
  Reply reply = Generate({"base-copy"}, "", Prompt(1), 16);  // auto: identical weights -> raw
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(reply.events["base-copy"].front().started().mode(), "raw");
  EXPECT_EQ(reply.ids["base-copy"], Reference("base-copy", TransferMode::kLocal, Prompt(1), 16));
}

TEST_F(ServingTest, FanOutRunsOnePrefillAndMatchesBothSingleTargetReferences) {
  const uint64_t before = producer_service_->prefills();
  Reply reply = Generate({"fables", "xs"}, "scd", Prompt(3), 16);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(producer_service_->prefills(), before + 1);
  EXPECT_EQ(reply.ids["fables"], Reference("fables", TransferMode::kScd, Prompt(3), 16));
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(3), 16));
}

TEST_F(ServingTest, SixteenConcurrentRequestsAllCompleteUnmixed) {
  struct Case {
    std::string target;
    int prompt;
    int max_tokens;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    cases.push_back({i % 2 ? "xs" : "fables", i % 4, 8 + i});
  }
  std::vector<Reply> replies(cases.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < cases.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] = Generate({cases[i].target}, "scd", Prompt(cases[i].prompt), cases[i].max_tokens);
    });
  }
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(replies[i].status.ok()) << i << ": " << replies[i].status.error_message();
    ASSERT_TRUE(replies[i].events[cases[i].target].back().has_finished()) << i;
    EXPECT_EQ(replies[i].ids[cases[i].target],
              Reference(cases[i].target, TransferMode::kScd, Prompt(cases[i].prompt),
                        cases[i].max_tokens))
        << "request " << i;
  }
}

TEST_F(ServingTest, FullConsumerRefusesBeforeTheProducerSends) {
  std::vector<std::unique_ptr<consumer::Admission::Slot>> held;
  for (int i = 0; i < 16; ++i) held.push_back(testing::Ok(consumers_["xs"]->admission->Admit()));
  const uint64_t before = producer_service_->prefills();
  Reply reply = Generate({"xs"}, "scd", Prompt(2), 8);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_EQ(reply.events["xs"].size(), 1u);
  EXPECT_EQ(reply.events["xs"][0].error().code(),
            static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(producer_service_->prefills(), before);  // nothing was prefilled or sent
  held.clear();
  EXPECT_TRUE(Generate({"xs"}, "scd", Prompt(2), 8).events["xs"].back().has_finished());
}

TEST_F(ServingTest, CancelledRequestLeavesTheNextOneOnTheConsumerExact) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::GenerateRequest request;
    request.add_targets("xs");
    request.set_mode("scd");
    for (TokenId id : Prompt(3)) request.add_prompt_ids(id);
    request.set_max_tokens(200);
    grpc::ClientContext context;
    auto reader = stub_->Generate(&context, request);
    v1::GenerateEvent event;
    ASSERT_TRUE(reader->Read(&event));  // Started: admitted, transfer under way
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    reader->Finish();
    Reply next = Generate({"xs"}, "scd", Prompt(2), 16);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16));
  }
  // Every slot comes back.
  const absl::Time limit = absl::Now() + absl::Seconds(2);
  while (consumers_["xs"]->admission->active() > 0 && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(consumers_["xs"]->admission->active(), 0u);
}

TEST_F(ServingTest, PromptsOfOneTokenAndOfTheMaximumLengthComplete) {
  Reply one = Generate({"xs"}, "scd", {Prompt(0)[0]}, 8);
  ASSERT_TRUE(one.events["xs"].back().has_finished()) << one.events["xs"].back().DebugString();
  EXPECT_EQ(one.events["xs"].front().started().mode(), "local");
  std::vector<TokenId> longest;
  const int64_t max = consumers_["xs"]->model->config().max_position_embeddings;
  while (static_cast<int64_t>(longest.size()) < max) {
    for (TokenId id : Prompt(1)) {
      if (static_cast<int64_t>(longest.size()) < max) longest.push_back(id);
    }
  }
  Reply full = Generate({"xs"}, "scd", longest, 8);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_TRUE(full.events["xs"].back().has_finished()) << full.events["xs"].back().DebugString();
  EXPECT_EQ(full.events["xs"].back().finished().prompt_tokens(), static_cast<uint32_t>(max));
  EXPECT_EQ(full.events["xs"].back().finished().reason(), "length");
  longest.push_back(longest.back());  // one past the maximum: refused with its own code
  Reply over = Generate({"xs"}, "scd", longest, 8);
  EXPECT_EQ(over.events["xs"].back().error().code(),
            static_cast<int>(grpc::StatusCode::OUT_OF_RANGE));
}

TEST_F(ServingTest, UnknownTargetIsNotFoundNamingTheKnownOnes) {
  Reply reply = Generate({"nope"}, "", Prompt(0), 4);
  EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(reply.status.error_message(), HasSubstr("base-copy, fables, xs"));
}

}  // namespace
}  // namespace scd
