// Every daemon's /metrics scraped by a real Prometheus (Debian's `prometheus`) after traffic
// through the coordinator: its query API returns the TTFT histogram's count equal to the requests
// sent and transfer bytes equal to the sum of the Finished events' payload_bytes (on the
// coordinator and on the consumer that received them), the refused call counted apart, the
// producer's prefills, and every target up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "tests/cluster_client.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using testing::Bin;
using testing::Daemon;

// The value of an instant query's single sample; nullopt while there is none.
std::optional<double> Query(httplib::Client& prometheus, const std::string& promql) {
  auto result = prometheus.Get("/api/v1/query", {{"query", promql}}, httplib::Headers());
  if (!result || result->status != 200) return std::nullopt;
  const nlohmann::json body = nlohmann::json::parse(result->body, nullptr, false);
  if (!body.is_object() || body.value("status", "") != "success") return std::nullopt;
  const nlohmann::json& samples = body["data"]["result"];
  if (!samples.is_array() || samples.size() != 1) return std::nullopt;
  return std::stod(samples[0]["value"][1].get<std::string>());
}

TEST(PrometheusScrapeTest, QueriesReturnWhatTheClientsSaw) {
  testing::TempDir dir;
  const std::string model = testing::ModelDir("stories260k");
  Daemon coordinator(dir.path(), "coordinator",
                     {Bin("scd-coordinator"), "--listen", "127.0.0.1:0", "--control-listen",
                      "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  const std::string server = coordinator.Address();
  const std::string control = coordinator.ControlAddress();
  ASSERT_FALSE(control.empty());
  Daemon producer(dir.path(), "producer",
                  {Bin("scd-producer"), "--model", model, "--coordinator", control,
                   "--http-listen", "127.0.0.1:0"});
  Daemon consumer(dir.path(), "consumer",
                  {Bin("scd-consumer"), "--model", model, "--name", "copy", "--coordinator",
                   control, "--http-listen", "127.0.0.1:0"});
  const std::string http[] = {coordinator.HttpAddress(), producer.HttpAddress(),
                              consumer.HttpAddress()};
  ASSERT_TRUE(testing::WaitForModels(coordinator, 2, absl::Seconds(60)))
      << "the nodes did not register; logs in " << dir.path();

  // Traffic: five requests (raw: identical weights), one refused as a whole.
  constexpr int kRequests = 5;
  uint64_t payload_bytes = 0;
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateRequest request;
    request.set_prompt(absl::StrCat("Once upon a time, there were ", i + 2, " cats"));
    request.add_targets("copy");
    SetRequestMode(*ParseRequestedMode("raw"), &request);
    request.set_max_tokens(8);
    int finished = 0;
    ASSERT_TRUE(StreamGenerate(server, request, absl::Seconds(30), [&](const v1::GenerateEvent& e) {
                  if (!e.has_finished()) return;
                  ++finished;
                  payload_bytes += e.finished().payload_bytes();
                }).ok());
    ASSERT_EQ(finished, 1);
  }
  ASSERT_GT(payload_bytes, 0u);
  v1::GenerateRequest unknown;
  unknown.set_prompt("x");
  unknown.add_targets("nobody");
  EXPECT_EQ(StreamGenerate(server, unknown, absl::Seconds(30), [](const v1::GenerateEvent&) {})
                .code(),
            absl::StatusCode::kNotFound);

  // A real Prometheus scraping the three daemons every second.
  const int port = testing::FreeLoopbackPort();
  std::string config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n";
  const char* jobs[] = {"coordinator", "producer", "consumer"};
  for (int i = 0; i < 3; ++i) {
    absl::StrAppend(&config, "  - job_name: ", jobs[i], "\n    static_configs:\n      - targets: ['",
                    http[i], "']\n");
  }
  testing::WriteFile(dir.File("prometheus.yml"), config);
  absl::StatusOr<ChildProcess> prometheus = ChildProcess::Start(
      {"prometheus", "--config.file=" + dir.File("prometheus.yml"),
       "--storage.tsdb.path=" + dir.File("tsdb"),
       "--web.listen-address=127.0.0.1:" + std::to_string(port)},
      dir.File("prometheus.log"));
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);

  const std::string ttft =
      "sum(scd:time_to_first_token_seconds_count{job=\"coordinator\"})";
  std::optional<double> count;
  const absl::Time scraped_by = absl::Now() + absl::Seconds(60);
  while (absl::Now() < scraped_by) {
    count = Query(client, ttft);
    std::optional<double> up = Query(client, "sum(up)");
    if (count && up && *up == 3) break;
    // waits: a real Prometheus (a foreign process) to scrape; its query API is the only way to see
    //  it
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(count.has_value()) << "no scrape; " << testing::ReadFile(dir.File("prometheus.log"));
  EXPECT_EQ(*count, kRequests);
  EXPECT_EQ(Query(client, "sum(scd:transfer_bytes_total{job=\"coordinator\"})"),
            static_cast<double>(payload_bytes));
  EXPECT_EQ(Query(client, "sum(scd:transfer_bytes_total{job=\"consumer\",model=\"copy\"})"),
            static_cast<double>(payload_bytes));
  EXPECT_EQ(Query(client, "sum(scd:time_to_first_token_seconds_count{job=\"consumer\"})"),
            kRequests);
  EXPECT_EQ(Query(client, "sum(scd:requests_total{job=\"coordinator\",mode=\"raw\"})"), kRequests);
  EXPECT_EQ(Query(client, "scd:request_failures_total{job=\"coordinator\",reason=\"refused\"}"),
            1);
  EXPECT_EQ(Query(client, "scd:request_failures_total{job=\"coordinator\",reason=\"transport\"}"),
            0);
  EXPECT_EQ(Query(client, "scd:prefills_total{job=\"producer\"}"), kRequests);
  EXPECT_EQ(Query(client, "scd:generation_tokens_total{job=\"coordinator\"}"), kRequests * 8);
  EXPECT_EQ(Query(client, "sum(scd:compression_ratio_count{job=\"consumer\"})"), kRequests);
  EXPECT_EQ(Query(client, "scd:num_requests_running{job=\"coordinator\"}"), 0);
  // Fast ejection's counts are there from the start (nothing failed here: all 0).
  EXPECT_EQ(Query(client, "scd:nodes_out{job=\"coordinator\"}"), 0);
  EXPECT_EQ(Query(client, "scd:node_ejections_total{job=\"coordinator\"}"), 0);
  EXPECT_EQ(Query(client, "scd:node_returns_total{job=\"coordinator\"}"), 0);
  EXPECT_EQ(Query(client, "count(scd:ejection_advice_total{job=\"coordinator\"})"), 3);
  prometheus->Terminate(absl::Seconds(10));
}

TEST(PrometheusScrapeTest, HealthSaysLoadingUntilTheNodeServes) {
  testing::TempDir dir;
  // A port held by this test: the coordinator cannot take it, so it fails at once with the
  // address in its one error line (what an operator sees for a port in use).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  const testing::CommandResult refused =
      testing::RunCommand(Bin("scd-coordinator") + " --http-listen " + taken);
  close(fd);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, ::testing::HasSubstr("cannot listen for HTTP on " + taken));

  // A consumer loading a model: /health is 503 "loading" or (once loaded) 200 "serving", never
  // refused; after SIGTERM it drains.
  Daemon consumer(dir.path(), "consumer",
                  {Bin("scd-consumer"), "--model", testing::ModelDir("stories260k"), "--name", "c",
                   "--http-listen", "127.0.0.1:0"});
  const std::string http = consumer.HttpAddress();
  ASSERT_FALSE(http.empty());
  httplib::Client client("http://" + http);
  bool serving = false;
  for (int i = 0; i < 400 && !serving; ++i) {
    auto health = client.Get("/health");
    ASSERT_TRUE(health) << "the listener is up before the model loads";
    if (health->status == 200) {
      EXPECT_EQ(health->body, "{\"status\":\"serving\"}");
      serving = true;
    } else {
      EXPECT_EQ(health->status, 503);
      EXPECT_EQ(health->body, "{\"status\":\"loading\"}");
      // waits: the consumer's /health answers `loading` until its model is in; sampling it is what
      //  this test checks
      absl::SleepFor(absl::Milliseconds(25));
    }
  }
  ASSERT_TRUE(serving);
  consumer.Address();
  auto missing = client.Get("/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, ::testing::HasSubstr("\"error\""));
  EXPECT_EQ(consumer.Terminate(absl::Seconds(20)), 0) << consumer.Ending();
}

// SIGTERM the moment the HTTP listener is up, while the model still loads (the kernel hands it to
// a thread OpenBLAS started before main, as no thread of ours waits for it yet): the daemon
// finishes starting, then drains and exits 0 -- it is not killed by the signal's default action.
TEST(PrometheusScrapeTest, ASigtermWhileLoadingDrainsOnceUp) {
  testing::TempDir dir;
  Daemon consumer(dir.path(), "consumer",
                  {Bin("scd-consumer"), "--model", testing::ModelDir("tinystories-4m"), "--name",
                   "c", "--http-listen", "127.0.0.1:0"});
  ASSERT_FALSE(consumer.HttpAddress().empty());
  EXPECT_EQ(consumer.Terminate(absl::Seconds(60)), 0) << consumer.Ending();
  EXPECT_THAT(testing::ReadFile(consumer.log()), ::testing::HasSubstr("SIGTERM: draining"));
}

}  // namespace
}  // namespace scd
