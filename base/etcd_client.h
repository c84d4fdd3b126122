// EtcdClient: the few etcd v3 calls SCD Serve's registry needs, over etcd's JSON gateway
// (HTTP/1.1 POST /v3/..., keys and values base64; Debian's etcd-server 3.4 serves it on its
// client port): leases (grant, keep-alive, revoke), put (optionally only if the key is new),
// range over a prefix, delete, and a watch on a prefix that streams events until stopped.
// Dynamo keeps its node registry the same way: a lease per process, keys under a prefix, a watch.
// Errors: UNAVAILABLE when etcd cannot be reached or answers with an HTTP error (the message
// says which call and what etcd said).
// Thread-safety: thread-safe; each call opens its own connection (calls are rare: seconds apart).
#ifndef SCD_BASE_ETCD_CLIENT_H_
#define SCD_BASE_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace scd {

struct EtcdKeyValue {
  std::string key, value;
  int64_t mod_revision = 0;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;
};

class EtcdClient {
 public:
  // `endpoint`: "etcd://HOST:PORT" or "HOST:PORT" (http).
  static absl::StatusOr<EtcdClient> Create(const std::string& endpoint);

  const std::string& endpoint() const { return host_port_; }

  // A lease of `ttl`; its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) const;
  // Renews the lease; NOT_FOUND when it expired (keys under it are gone).
  absl::Status KeepAlive(int64_t lease) const;
  absl::Status Revoke(int64_t lease) const;
  // Puts key=value (under `lease` when nonzero).
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease = 0) const;
  // Puts only when the key does not exist; ALREADY_EXISTS otherwise.
  absl::Status Create(const std::string& key, const std::string& value, int64_t lease) const;
  absl::Status Delete(const std::string& key) const;
  // Every key under `prefix`, and the store's revision when read.
  absl::StatusOr<std::vector<EtcdKeyValue>> Range(const std::string& prefix,
                                                  int64_t* revision = nullptr) const;
  // Streams the events under `prefix` from `start_revision` to `on_events` until `stop` is set
  // (checked whenever data or etcd's progress arrives, at least every `poll`), the connection
  // breaks (UNAVAILABLE), or etcd cancels the watch (compacted: OUT_OF_RANGE, re-read with
  // Range). OK only when stopped.
  absl::Status Watch(const std::string& prefix, int64_t start_revision,
                     const std::function<void(const std::vector<EtcdEvent>&)>& on_events,
                     const std::atomic<bool>& stop) const;

 private:
  explicit EtcdClient(std::string host_port) : host_port_(std::move(host_port)) {}
  absl::StatusOr<std::string> Call(const std::string& path, const std::string& body) const;

  std::string host_port_;
};

// The end of the range of keys starting with `prefix` (etcd's range_end: the prefix with its last
// byte incremented).
std::string EtcdPrefixEnd(const std::string& prefix);

}  // namespace scd

#endif  // SCD_BASE_ETCD_CLIENT_H_
