// Security and limits (issue 18), with real processes, certificates made by the openssl CLI, and
// clients that are separate processes (the process-wide TLS settings are a client's own):
//  - TLS on every listener: a plaintext gRPC client and a plain-HTTP client are refused, clients
//    trusting the CA are served (gRPC and HTTPS);
//  - mutual TLS between nodes: coordinator, producer and consumer as separate daemons, each
//    requiring client certificates, codes over the gRPC transport; a client without a
//    certificate, or with one from another CA, is refused;
//  - nodes sharing a certificate for one name (--tls-server-name), dialling each other at IPs no
//    certificate names, as pods do on Kubernetes (deploy/k8s/components/tls);
//  - a bearer token: UNAUTHENTICATED / HTTP 401 without it or with another, served with it,
//    /health open;
//  - limits: output tokens, prompt tokens, requests per client, message and body size, each
//    refused with its status and a message naming the limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using ::testing::HasSubstr;
using testing::Bin;
using testing::Daemon;
using testing::RunCommand;

// A CA, a certificate for 127.0.0.1/localhost signed by it (servers and nodes), one for the name
// scd-node only (nodes that share a certificate, as on Kubernetes), a client certificate signed
// by it, and a client certificate from another CA.
void MakeCertificates(const testing::TempDir& dir) {
  const std::string d = dir.path();
  const std::string script = absl::StrCat(
      "set -e; cd ", d, "\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "  -subj /CN=scd-test-ca 2>/dev/null\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout rogue-ca.key -out rogue-ca.pem -days 2 "
      "  -subj /CN=rogue-ca 2>/dev/null\n",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext\n",
      "printf 'subjectAltName=DNS:scd-node\\n' > shared.ext\n",
      "for name in node client rogue shared; do\n",
      "  openssl req -newkey rsa:2048 -nodes -keyout $name.key -out $name.csr -subj /CN=$name "
      "2>/dev/null\n",
      "done\n",
      "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem "
      "  -days 2 -extfile san.ext 2>/dev/null\n",
      "openssl x509 -req -in shared.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out shared.pem "
      "  -days 2 -extfile shared.ext 2>/dev/null\n",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
      "  -days 2 2>/dev/null\n",
      "openssl x509 -req -in rogue.csr -CA rogue-ca.pem -CAkey rogue-ca.key -CAcreateserial "
      "  -out rogue.pem -days 2 2>/dev/null\n");
  testing::WriteFile(dir.File("certs.sh"), script);
  const testing::CommandResult made = RunCommand("sh " + dir.File("certs.sh"));
  ASSERT_EQ(made.exit_code, 0) << made.err;
}

std::string AllInOne(const std::string& extra_flags) {
  const std::string base = testing::ModelDir("stories260k");
  return absl::StrCat(Bin("scd"), " serve --all-in-one --producer-model ", base,
                      " --consumer copy=", base, " --listen 127.0.0.1:0", extra_flags);
}

// `scd generate --server` as a separate client process.
testing::CommandResult Client(const std::string& address, const std::string& flags,
                              const std::string& env = "") {
  return RunCommand(absl::StrCat(env, " ", Bin("scd"), " generate --server ", address,
                                 " --target copy --max-tokens 4 --prompt 'Once upon a time' ",
                                 flags));
}

// The client, again until it is served (up to 60 s): nodes register over TLS, and only a client
// holding the certificates can ask whether they have (the coordinator's Stats need no TLS-free
// port here).
testing::CommandResult ClientOnceServed(const std::string& address, const std::string& flags) {
  testing::CommandResult served;
  const absl::Time limit = absl::Now() + absl::Seconds(60);
  do {
    served = Client(address, flags);
    if (served.exit_code == 0) break;
    // waits: the nodes' registration over TLS, which only such a client can observe
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < limit);
  return served;
}

// argv with the TLS flags appended.
std::vector<std::string> WithTls(std::vector<std::string> argv,
                                 const std::vector<std::string>& tls) {
  argv.insert(argv.end(), tls.begin(), tls.end());
  return argv;
}

// A coordinator (with an HTTP listener), a producer and a consumer "copy" of stories260k as
// separate daemons, every one with the same TLS flags, codes over the gRPC transport.
struct SeparateNodes {
  SeparateNodes(const testing::TempDir& dir, const std::vector<std::string>& tls)
      : coordinator(dir.path(), "coordinator",
                    WithTls({Bin("scd-coordinator"), "--listen", "127.0.0.1:0", "--control-listen",
                             "127.0.0.1:0", "--http-listen", "127.0.0.1:0"},
                            tls)),
        control(coordinator.ControlAddress()),
        producer(dir.path(), "producer",
                 WithTls({Bin("scd-producer"), "--model", testing::ModelDir("stories260k"),
                          "--coordinator", control, "--transport", "grpc"},
                         tls)),
        consumer(dir.path(), "consumer",
                 WithTls({Bin("scd-consumer"), "--model", testing::ModelDir("stories260k"),
                          "--name", "copy", "--coordinator", control, "--transport", "grpc"},
                         tls)) {}
  Daemon coordinator;
  const std::string control;  // "" when the coordinator did not serve (a test failure then)
  Daemon producer, consumer;
};

std::vector<std::string> Split(const std::string& flags) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < flags.size()) {
    size_t end = flags.find(' ', start);
    if (end == std::string::npos) end = flags.size();
    if (end > start) out.push_back(flags.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

TEST(SecurityTest, TlsRefusesPlaintextAndServesClientsThatTrustTheCa) {
  testing::TempDir dir;
  MakeCertificates(dir);
  if (HasFatalFailure()) return;
  std::vector<std::string> argv = Split(AllInOne(absl::StrCat(
      " --http-listen 127.0.0.1:0 --tls-cert ", dir.File("node.pem"), " --tls-key ",
      dir.File("node.key"), " --tls-ca ", dir.File("ca.pem"))));
  Daemon server(dir.path(), "serve", argv);
  const std::string address = server.Address(absl::Seconds(60));
  const std::string http = server.HttpAddress();
  ASSERT_FALSE(address.empty());

  const testing::CommandResult plain = Client(address, "");
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_THAT(plain.err, HasSubstr("UNAVAILABLE"));
  const testing::CommandResult trusted = Client(address, "--tls-ca " + dir.File("ca.pem"));
  EXPECT_EQ(trusted.exit_code, 0) << trusted.err;
  EXPECT_FALSE(trusted.out.empty());
  const testing::CommandResult other_ca = Client(address, "--tls-ca " + dir.File("rogue-ca.pem"));
  EXPECT_NE(other_ca.exit_code, 0);

  const std::string port = http.substr(http.rfind(':') + 1);
  const testing::CommandResult plain_http =
      RunCommand("curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:" + port + "/health");
  EXPECT_NE(plain_http.out, "200");
  const testing::CommandResult https = RunCommand(
      "curl -s -m 5 --cacert " + dir.File("ca.pem") + " https://127.0.0.1:" + port + "/health");
  EXPECT_EQ(https.out, "{\"status\":\"serving\"}") << https.err;
  const testing::CommandResult completion = RunCommand(
      "curl -s -m 30 --cacert " + dir.File("ca.pem") + " https://localhost:" + port +
      "/v1/completions -d '{\"model\":\"copy\",\"prompt\":\"Once\",\"max_tokens\":3}'");
  EXPECT_THAT(completion.out, HasSubstr("\"completion_tokens\":3")) << completion.err;
}

TEST(SecurityTest, MutualTlsBetweenSeparateNodes) {
  testing::TempDir dir;
  MakeCertificates(dir);
  if (HasFatalFailure()) return;
  const std::vector<std::string> tls = {"--tls-cert", dir.File("node.pem"), "--tls-key",
                                        dir.File("node.key"), "--tls-ca", dir.File("ca.pem"),
                                        "--tls-require-client-cert"};
  SeparateNodes nodes(dir, tls);
  const std::string server = nodes.coordinator.Address();
  ASSERT_FALSE(nodes.control.empty());
  const std::string client_tls = absl::StrCat("--tls-ca ", dir.File("ca.pem"), " --tls-cert ",
                                              dir.File("client.pem"), " --tls-key ",
                                              dir.File("client.key"));
  // Registration and routing run over mutual TLS.
  const testing::CommandResult served = ClientOnceServed(server, client_tls + " --mode raw");
  ASSERT_EQ(served.exit_code, 0) << served.err << "\nlogs in " << dir.path();
  EXPECT_FALSE(served.out.empty());

  const testing::CommandResult no_cert = Client(server, "--tls-ca " + dir.File("ca.pem"));
  EXPECT_NE(no_cert.exit_code, 0);
  const testing::CommandResult rogue = Client(
      server, absl::StrCat("--tls-ca ", dir.File("ca.pem"), " --tls-cert ", dir.File("rogue.pem"),
                           " --tls-key ", dir.File("rogue.key")));
  EXPECT_NE(rogue.exit_code, 0);
}

TEST(SecurityTest, NodesSharingACertificateCheckItForTheServerName) {
  testing::TempDir dir;
  MakeCertificates(dir);
  if (HasFatalFailure()) return;
  // The certificate names scd-node only; every node dials the others at 127.0.0.1.
  const std::vector<std::string> tls = {
      "--tls-cert", dir.File("shared.pem"), "--tls-key",         dir.File("shared.key"),
      "--tls-ca",   dir.File("ca.pem"),     "--tls-server-name", "scd-node"};
  SeparateNodes nodes(dir, tls);
  const std::string server = nodes.coordinator.Address();
  ASSERT_FALSE(nodes.control.empty());
  const std::string client_tls =
      absl::StrCat("--tls-ca ", dir.File("ca.pem"), " --tls-server-name scd-node --mode raw");
  // Registration, routing and the codes' transfer all check the certificate for scd-node.
  const testing::CommandResult served = ClientOnceServed(server, client_tls);
  ASSERT_EQ(served.exit_code, 0) << served.err << "\nlogs in " << dir.path();
  EXPECT_FALSE(served.out.empty());

  // Without the name the certificate does not name the address: refused.
  const testing::CommandResult by_ip = Client(server, "--tls-ca " + dir.File("ca.pem"));
  EXPECT_NE(by_ip.exit_code, 0);
  // The HTTP listener presents the same certificate (curl checks it for scd-node).
  const std::string http = nodes.coordinator.HttpAddress();
  const std::string port = http.substr(http.rfind(':') + 1);
  const testing::CommandResult https = RunCommand(
      absl::StrCat("curl -s -m 5 --cacert ", dir.File("ca.pem"), " --resolve scd-node:", port,
                   ":127.0.0.1 https://scd-node:", port, "/livez"));
  EXPECT_THAT(https.out, HasSubstr("alive")) << https.err;

  // Bad input: a server name without TLS, or one that is no host name.
  const testing::CommandResult no_tls = Client(server, "--tls-server-name scd-node");
  EXPECT_NE(no_tls.exit_code, 0);
  EXPECT_THAT(no_tls.err, HasSubstr("--tls-server-name needs TLS on"));
  const testing::CommandResult unexpanded =
      Client(server, absl::StrCat("--tls-ca ", dir.File("ca.pem"), " --tls-server-name '$(NAME)'"));
  EXPECT_NE(unexpanded.exit_code, 0);
  EXPECT_THAT(unexpanded.err, HasSubstr("unexpanded $(VAR)"));
}

TEST(SecurityTest, ABearerTokenGuardsThePublicApis) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("token"), "s3cret-token\n");
  Daemon server(dir.path(), "serve",
                Split(AllInOne(" --http-listen 127.0.0.1:0 --api-token-file " + dir.File("token"))));
  const std::string address = server.Address(absl::Seconds(60));
  const std::string http = server.HttpAddress();
  ASSERT_FALSE(address.empty());

  v1::GenerateRequest request;
  request.set_prompt("Once");
  request.add_targets("copy");
  const absl::Status refused =
      StreamGenerate(address, request, absl::Seconds(30), [](const v1::GenerateEvent&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ListModels(address, absl::Seconds(5)).status().code(),
            absl::StatusCode::kUnauthenticated);
  const testing::CommandResult without = Client(address, "");
  EXPECT_NE(without.exit_code, 0);
  EXPECT_THAT(without.err, HasSubstr("needs an API token: send `authorization: Bearer"));
  const testing::CommandResult wrong = Client(address, "", "SCD_API_TOKEN=guess");
  EXPECT_THAT(wrong.err, HasSubstr("wrong API token"));
  const testing::CommandResult with = Client(address, "", "SCD_API_TOKEN=s3cret-token");
  EXPECT_EQ(with.exit_code, 0) << with.err;

  const std::string url = "http://" + http;
  const std::string body = " -d '{\"model\":\"copy\",\"prompt\":\"Once\",\"max_tokens\":2}'";
  const testing::CommandResult http_without =
      RunCommand("curl -s -m 30 -w ' %{http_code}' " + url + "/v1/completions" + body);
  EXPECT_THAT(http_without.out, HasSubstr(" 401"));
  EXPECT_THAT(http_without.out, HasSubstr("\"type\":\"authentication_error\""));
  const testing::CommandResult models_without =
      RunCommand("curl -s -m 30 -w ' %{http_code}' " + url + "/v1/models");
  EXPECT_THAT(models_without.out, HasSubstr(" 401"));
  const testing::CommandResult http_with = RunCommand(
      "curl -s -m 30 -w ' %{http_code}' -H 'Authorization: Bearer s3cret-token' " + url +
      "/v1/completions" + body);
  EXPECT_THAT(http_with.out, HasSubstr(" 200"));
  const testing::CommandResult health =
      RunCommand("curl -s -m 5 -w ' %{http_code}' " + url + "/health");
  EXPECT_EQ(health.out, "{\"status\":\"serving\"} 200");
}

TEST(SecurityTest, EachLimitRefusesWithItsStatus) {
  testing::TempDir dir;
  Daemon server(dir.path(), "serve",
                Split(AllInOne(" --http-listen 127.0.0.1:0 --max-output-tokens 64"
                               " --max-prompt-tokens 16 --max-requests-per-client 1"
                               " --max-message-mb 0.01")));
  const std::string address = server.Address(absl::Seconds(60));
  const std::string http = server.HttpAddress();
  ASSERT_FALSE(address.empty());
  auto generate = [&address](v1::GenerateRequest request) {
    request.add_targets("copy");
    SetRequestMode(*ParseRequestedMode("raw"), &request);
    return StreamGenerate(address, request, absl::Seconds(30), [](const v1::GenerateEvent&) {});
  };
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(65);
  absl::Status status = generate(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("max_tokens"));
  EXPECT_THAT(status.message(), HasSubstr("64"));

  request.set_max_tokens(4);
  request.set_prompt(
      "Once upon a time there was a little girl named Lily who loved to play in the park with "
      "her friends every day");
  status = generate(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("over this server's limit of 16"));
  v1::GenerateRequest ids;
  for (int i = 0; i < 17; ++i) ids.add_prompt_ids(100 + i);
  ids.set_max_tokens(4);
  EXPECT_EQ(generate(ids).code(), absl::StatusCode::kOutOfRange);

  // A 20 KiB message against a 10 KiB limit: gRPC refuses it, HTTP answers 413.
  v1::GenerateRequest big;
  big.set_prompt(std::string(20 << 10, 'a'));
  status = generate(big);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("larger than max"));
  testing::TempDir body_dir;
  testing::WriteFile(body_dir.File("body.json"),
                     "{\"model\":\"copy\",\"prompt\":\"" + std::string(20 << 10, 'a') + "\"}");
  const testing::CommandResult too_big =
      RunCommand("curl -s -m 30 -w ' %{http_code}' http://" + http + "/v1/completions -d @" +
                 body_dir.File("body.json"));
  EXPECT_THAT(too_big.out, HasSubstr(" 413"));
  EXPECT_THAT(too_big.out, HasSubstr("the request body is too large (limit 10485 bytes)"));

  // One request at a time per client: eight at once, the others refused naming the limit.
  std::atomic<int> served{0}, refused{0}, other{0};
  std::string message;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r;
      r.set_prompt(absl::StrCat("Once upon a time ", i));
      r.set_max_tokens(64);
      const absl::Status s = generate(r);
      if (s.ok()) {
        ++served;
      } else if (s.code() == absl::StatusCode::kResourceExhausted) {
        if (++refused == 1) message = std::string(s.message());
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(served.load(), 1);
  EXPECT_GE(refused.load(), 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_THAT(message, HasSubstr("client 127.0.0.1 already has 1 requests running"));
}

}  // namespace
}  // namespace scd
