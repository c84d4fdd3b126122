// The three daemons as separate processes (scd-coordinator, scd-producer, two scd-consumers) over
// loopback, codes over the gRPC and over the UCX transport, driven through the coordinator's
// public API with the library client: greedy scd tokens on the hard pair equal the batch transfer
// path in this process; raw between identical models equals local generation; a consumer killed
// with SIGKILL leaves routing within 3 s and its target becomes NOT_FOUND; a producer killed before
// a request ends it in one Error within 1 s; SIGTERM drains and every daemon exits 0.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "codec/transfer.h"
#include "model/generator.h"
#include "proto/inference_client.h"
#include "tests/test_util.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// One daemon: its stderr goes to DIR/NAME.log; it writes its address to DIR/NAME.addr.
class Daemon {
 public:
  Daemon(const std::string& dir, const std::string& name, std::vector<std::string> argv)
      : log_(dir + "/" + name + ".log"), address_file_(dir + "/" + name + ".addr") {
    argv.push_back("--address-file");
    argv.push_back(address_file_);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The address once it serves ("" after `timeout`: see the log).
  std::string Address(absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time limit = absl::Now() + timeout;
    while (absl::Now() < limit) {
      std::ifstream in(address_file_);
      std::string address;
      if (in >> address) return address;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "no address from " << log_ << ":\n" << testing::ReadFile(log_);
    return "";
  }
  void Kill(int signal) { kill(pid_, signal); }
  // Exit status after SIGTERM (-1: killed or timed out).
  int Terminate(absl::Duration timeout) {
    kill(pid_, SIGTERM);
    const absl::Time limit = absl::Now() + timeout;
    int status = 0;
    while (absl::Now() < limit) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }
  const std::string& log() const { return log_; }

 private:
  std::string log_, address_file_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

std::string Bin(const std::string& name) { return testing::BuildDir() + "/bin/" + name; }

class DaemonsProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
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

    coordinator_ =
        std::make_unique<Daemon>(dir_, "coordinator",
                                 std::vector<std::string>{Bin("scd-coordinator"), "--listen",
                                                          "127.0.0.1:0", "--lease-ms", "2000"});
    server_ = coordinator_->Address();
    ASSERT_FALSE(server_.empty());
    const std::string transport = GetParam();
    producer_daemon_ = std::make_unique<Daemon>(
        dir_, "producer",
        std::vector<std::string>{Bin("scd-producer"), "--model", testing::ModelDir("stories260k"),
                                 "--coordinator", server_, "--transport", transport, "--artifact",
                                 artifact_path_});
    xs_daemon_ = std::make_unique<Daemon>(
        dir_, "xs",
        std::vector<std::string>{Bin("scd-consumer"), "--model", testing::ModelDir("llama2xs-260k"),
                                 "--name", "xs", "--coordinator", server_, "--transport", transport,
                                 "--artifact", artifact_path_});
    copy_daemon_ = std::make_unique<Daemon>(
        dir_, "copy",
        std::vector<std::string>{Bin("scd-consumer"), "--model", testing::ModelDir("stories260k"),
                                 "--name", "base-copy", "--coordinator", server_, "--transport",
                                 transport});
    // Registered: all three models routable.
    const absl::Time limit = absl::Now() + absl::Seconds(60);
    while (absl::Now() < limit) {
      auto models = ListModels(server_, absl::Seconds(2));
      if (models.ok() && models->size() == 3) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "daemons did not register; logs in " << dir_;
  }
  void TearDown() override {
    if (HasFailure()) return;  // keep the logs
    fs::remove_all(dir_);
  }

  struct Reply {
    absl::Status status;
    std::vector<TokenId> ids;
    std::vector<v1::GenerateEvent> events;
  };
  Reply Generate(const std::string& target, const std::string& mode,
                 const std::vector<TokenId>& prompt, int max_tokens) {
    v1::GenerateRequest request;
    request.add_targets(target);
    request.set_mode(mode);
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(max_tokens);
    Reply reply;
    reply.status = StreamGenerate(server_, request, absl::Seconds(60), [&](const auto& event) {
      reply.events.push_back(event);
      for (int32_t id : event.token().ids()) reply.ids.push_back(id);
    });
    return reply;
  }
  std::vector<TokenId> Reference(const LlamaModel& consumer, TransferMode mode,
                                 const std::vector<TokenId>& prompt, int max_tokens) {
    KvCache cache = consumer.NewCache(64);
    if (mode != TransferMode::kLocal) {
      TransferPath path = testing::Ok(TransferPath::Create(
          mode, *producer_, consumer, ModeNeedsArtifact(mode) ? &artifact_ : nullptr, {}));
      const std::vector<TokenId> prefix(prompt.begin(), prompt.end() - 1);
      EXPECT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
    }
    GenerationOptions options;
    options.max_tokens = max_tokens;
    return testing::Ok(GenerateTokens(consumer, prompt, &cache, options)).output_ids;
  }

  std::string dir_, server_, artifact_path_;
  std::unique_ptr<LlamaModel> producer_, xs_;
  Artifact artifact_;
  std::unique_ptr<Daemon> coordinator_, producer_daemon_, xs_daemon_, copy_daemon_;
};

std::vector<TokenId> Prompt(int i) { return testing::LoadGolden("stories260k").prompts[i].ids; }

TEST_P(DaemonsProcessTest, ScdAndRawMatchTheirReferencesAndSigtermDrains) {
  Reply scd = Generate("xs", "scd", Prompt(2), 16);
  ASSERT_TRUE(scd.status.ok()) << scd.status;
  ASSERT_TRUE(scd.events.back().has_finished()) << scd.events.back().DebugString();
  EXPECT_EQ(scd.events.back().finished().mode(), "scd");
  EXPECT_EQ(scd.ids, Reference(*xs_, TransferMode::kScd, Prompt(2), 16));

  Reply raw = Generate("base-copy", "", Prompt(1), 16);  // auto: identical weights -> raw
  ASSERT_TRUE(raw.status.ok()) << raw.status;
  EXPECT_EQ(raw.events.front().started().mode(), "raw");
  EXPECT_EQ(raw.ids, Reference(*producer_, TransferMode::kLocal, Prompt(1), 16));

  EXPECT_EQ(xs_daemon_->Terminate(absl::Seconds(10)), 0) << testing::ReadFile(xs_daemon_->log());
  EXPECT_EQ(copy_daemon_->Terminate(absl::Seconds(10)), 0);
  EXPECT_EQ(producer_daemon_->Terminate(absl::Seconds(10)), 0);
  EXPECT_EQ(coordinator_->Terminate(absl::Seconds(10)), 0);
}

TEST_P(DaemonsProcessTest, KilledConsumerLeavesRoutingWithinThreeSeconds) {
  copy_daemon_->Kill(SIGKILL);
  const absl::Time killed = absl::Now();
  for (;;) {
    auto models = ListModels(server_, absl::Seconds(2));
    ASSERT_TRUE(models.ok()) << models.status();
    if (models->size() == 2) break;
    ASSERT_LT(absl::Now() - killed, absl::Seconds(3)) << "still routed after 3 s";
    absl::SleepFor(absl::Milliseconds(20));
  }
  Reply gone = Generate("base-copy", "", Prompt(1), 4);
  EXPECT_EQ(gone.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status.message()), HasSubstr("known targets: xs"));
}

TEST_P(DaemonsProcessTest, DeadProducerEndsTheRequestInOneErrorWithinOneSecond) {
  producer_daemon_->Kill(SIGKILL);  // still routed until its lease lapses
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  Reply reply = Generate("xs", "scd", Prompt(2), 16);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(reply.status.ok()) << reply.status;
  ASSERT_TRUE(reply.events.back().has_error()) << reply.events.back().DebugString();
  EXPECT_THAT(reply.events.back().error().message(), HasSubstr("producer"));
  int terminal = 0;
  for (const auto& e : reply.events) terminal += e.has_finished() || e.has_error();
  EXPECT_EQ(terminal, 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, DaemonsProcessTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace scd
