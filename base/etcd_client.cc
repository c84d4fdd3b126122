#include "base/etcd_client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/host_port.h"

namespace scd {
namespace {

using Json = nlohmann::json;

std::string B64(const std::string& bytes) { return absl::Base64Escape(bytes); }

std::string Unb64(const Json& value) {
  std::string out;
  if (value.is_string()) absl::Base64Unescape(value.get<std::string>(), &out);
  return out;
}

// etcd's JSON encodes int64 as strings.
int64_t Int(const Json& value) {
  int64_t out = 0;
  if (value.is_string()) {
    (void)absl::SimpleAtoi(value.get<std::string>(), &out);
  } else if (value.is_number_integer()) {
    out = value.get<int64_t>();
  }
  return out;
}

EtcdKeyValue KeyValue(const Json& kv) {
  EtcdKeyValue out;
  out.key = Unb64(kv.value("key", Json()));
  out.value = Unb64(kv.value("value", Json()));
  out.mod_revision = Int(kv.value("mod_revision", Json()));
  return out;
}

}  // namespace

std::string EtcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<EtcdClient> EtcdClient::Create(const std::string& endpoint) {
  std::string address = endpoint;
  if (absl::StartsWith(address, "etcd://")) address = address.substr(7);
  if (absl::StartsWith(address, "http://")) address = address.substr(7);
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok() || parsed->host.empty() || parsed->port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint, "': expected etcd://HOST:PORT"));
  }
  return EtcdClient(parsed->ToString());
}

absl::StatusOr<std::string> EtcdClient::Call(const std::string& path,
                                             const std::string& body) const {
  httplib::Client client("http://" + host_port_);
  client.set_connection_timeout(3);
  client.set_read_timeout(10);
  httplib::Result result = client.Post(path, body, "application/json");
  if (!result) {
    return absl::UnavailableError(absl::StrCat("etcd ", host_port_, path, ": ",
                                               httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", host_port_, path, ": HTTP ", result->status, " ", result->body));
  }
  return result->body;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) const {
  absl::StatusOr<std::string> body = Call(
      "/v3/lease/grant", Json{{"TTL", std::max<int64_t>(1, absl::ToInt64Seconds(ttl))}}.dump());
  if (!body.ok()) return body.status();
  const Json answer = Json::parse(*body, nullptr, false);
  const int64_t id = answer.is_object() ? Int(answer.value("ID", Json())) : 0;
  if (id == 0) return absl::UnavailableError(absl::StrCat("etcd lease grant: ", *body));
  return id;
}

absl::Status EtcdClient::KeepAlive(int64_t lease) const {
  absl::StatusOr<std::string> body =
      Call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease)}}.dump());
  if (!body.ok()) return body.status();
  const Json answer = Json::parse(*body, nullptr, false);
  const Json result = answer.is_object() ? answer.value("result", Json::object()) : Json();
  if (!result.is_object() || Int(result.value("TTL", Json())) <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::Revoke(int64_t lease) const {
  return Call("/v3/lease/revoke", Json{{"ID", std::to_string(lease)}}.dump()).status();
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value,
                             int64_t lease) const {
  Json put = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", put.dump()).status();
}

absl::Status EtcdClient::Create(const std::string& key, const std::string& value,
                                int64_t lease) const {
  Json put = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const Json txn = {
      {"compare", Json::array({{{"key", B64(key)}, {"target", "CREATE"},
                                {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", Json::array({{{"request_put", put}}})}};
  absl::StatusOr<std::string> body = Call("/v3/kv/txn", txn.dump());
  if (!body.ok()) return body.status();
  const Json answer = Json::parse(*body, nullptr, false);
  if (!answer.is_object() || !answer.value("succeeded", false)) {
    return absl::AlreadyExistsError(absl::StrCat("etcd: key ", key, " exists"));
  }
  return absl::OkStatus();
}

absl::Status EtcdClient::Delete(const std::string& key) const {
  return Call("/v3/kv/deleterange", Json{{"key", B64(key)}}.dump()).status();
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::Range(const std::string& prefix,
                                                            int64_t* revision) const {
  absl::StatusOr<std::string> body =
      Call("/v3/kv/range", Json{{"key", B64(prefix)}, {"range_end", B64(EtcdPrefixEnd(prefix))}}
                               .dump());
  if (!body.ok()) return body.status();
  const Json answer = Json::parse(*body, nullptr, false);
  if (!answer.is_object()) return absl::UnavailableError("etcd range: not JSON");
  if (revision != nullptr) {
    *revision = Int(answer.value("header", Json::object()).value("revision", Json()));
  }
  std::vector<EtcdKeyValue> out;
  for (const Json& kv : answer.value("kvs", Json::array())) out.push_back(KeyValue(kv));
  return out;
}

absl::Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision,
                               const std::function<void(const std::vector<EtcdEvent>&)>& on_events,
                               const std::atomic<bool>& stop) const {
  httplib::Client client("http://" + host_port_);
  client.set_connection_timeout(3);
  // etcd sends a progress notification every few minutes at most; the read timeout bounds how
  // long a stop waits, so the watch asks for progress notifications and reconnects on timeout.
  client.set_read_timeout(2);
  const Json create = {{"create_request",
                        {{"key", B64(prefix)},
                         {"range_end", B64(EtcdPrefixEnd(prefix))},
                         {"start_revision", std::to_string(start_revision)},
                         {"progress_notify", true}}}};
  std::string pending;
  absl::Status status = absl::OkStatus();
  httplib::Request request;
  request.method = "POST";
  request.path = "/v3/watch";
  request.body = create.dump();
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    pending.append(data, size);
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const Json line = Json::parse(pending.substr(0, newline), nullptr, false);
      pending.erase(0, newline + 1);
      if (!line.is_object()) continue;
      const Json result = line.value("result", Json::object());
      if (result.value("canceled", false)) {
        status = absl::OutOfRangeError(absl::StrCat(
            "etcd watch canceled: ", result.value("cancel_reason", std::string("compacted"))));
        return false;
      }
      std::vector<EtcdEvent> events;
      for (const Json& e : result.value("events", Json::array())) {
        EtcdEvent event;
        event.type = e.value("type", std::string("PUT")) == "DELETE" ? EtcdEvent::Type::kDelete
                                                                   : EtcdEvent::Type::kPut;
        event.kv = KeyValue(e.value("kv", Json::object()));
        events.push_back(std::move(event));
      }
      if (!events.empty()) on_events(events);
    }
    return !stop.load();
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  client.send(request, response, error);
  if (stop.load()) return absl::OkStatus();
  if (!status.ok()) return status;
  if (error == httplib::Error::Read) {
    // A quiet watch timed out: the caller watches again from where it was.
    return absl::DeadlineExceededError("etcd watch: quiet");
  }
  return absl::UnavailableError(
      absl::StrCat("etcd watch on ", host_port_, ": ", httplib::to_string(error)));
}

}  // namespace scd
