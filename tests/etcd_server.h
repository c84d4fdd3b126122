// EtcdServer: a real etcd (Debian's etcd-server) for one test, on free loopback ports, its data
// and log in the test's directory; it is ready when Start returns (it answered a Range).
// Thread-safety: the owner's thread only.
#ifndef SCD_TESTS_ETCD_SERVER_H_
#define SCD_TESTS_ETCD_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/child_process.h"
#include "base/etcd_client.h"

namespace scd::testing {

class EtcdServer {
 public:
  // Starts etcd with its data under `dir` (etcd.log beside it); an error names the log's tail.
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start(const std::string& dir);
  ~EtcdServer();
  // "etcd://127.0.0.1:PORT", what --registry takes.
  const std::string& registry() const { return registry_; }
  const EtcdClient& client() const { return client_; }
  // Stops it (SIGTERM, then SIGKILL after `grace`); the exit status.
  int Terminate(absl::Duration grace);

 private:
  EtcdServer(ChildProcess process, std::string registry, EtcdClient client)
      : process_(std::move(process)), registry_(std::move(registry)), client_(std::move(client)) {}

  ChildProcess process_;
  const std::string registry_;
  const EtcdClient client_;
};

}  // namespace scd::testing

#endif  // SCD_TESTS_ETCD_SERVER_H_
