#include "tests/etcd_server.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/test_files.h"

namespace scd::testing {

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(const std::string& dir) {
  const int client_port = FreeLoopbackPort();
  int peer_port = FreeLoopbackPort();
  while (peer_port == client_port) peer_port = FreeLoopbackPort();
  const std::string client_url = absl::StrCat("http://127.0.0.1:", client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port);
  absl::StatusOr<ChildProcess> process = ChildProcess::Start(
      {"etcd", "--name", "scd-test", "--data-dir", dir + "/etcd", "--listen-client-urls",
       client_url, "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
       "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "scd-test=" + peer_url},
      dir + "/etcd.log");
  if (!process.ok()) return process.status();
  const std::string registry = absl::StrCat("etcd://127.0.0.1:", client_port);
  absl::StatusOr<EtcdClient> client = EtcdClient::Create(registry);
  if (!client.ok()) return client.status();
  // waits: etcd (a foreign process) is ready when it answers; it signals nothing else
  for (int i = 0; i < 200 && !client->Range("/").ok(); ++i) absl::SleepFor(absl::Milliseconds(50));
  if (!client->Range("/").ok()) {
    return absl::UnavailableError(
        absl::StrCat("etcd did not answer within 10 s: ", process->LogTail()));
  }
  return std::unique_ptr<EtcdServer>(
      new EtcdServer(*std::move(process), registry, *std::move(client)));
}

EtcdServer::~EtcdServer() { Terminate(absl::Seconds(10)); }

int EtcdServer::Terminate(absl::Duration grace) {
  if (!process_.running()) return process_.Wait(absl::ZeroDuration());
  return process_.Terminate(grace);
}

}  // namespace scd::testing
