#include "proto/cluster_secret.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/log_text.h"
#include "base/random_id.h"

namespace scd {
namespace {

constexpr char kHowTo[] =
    "give every node the same secret with --cluster-secret-file FILE or $SCD_CLUSTER_SECRET "
    "(e.g. `head -c 32 /dev/urandom | base64 > secret`)";

// Equal contents, in time that depends on the lengths only.
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<ClusterSecret> ClusterSecret::Of(std::string value) {
  if (value.size() < kMinClusterSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster secret has ", value.size(),
                                                   " bytes; it needs at least ",
                                                   kMinClusterSecretBytes, ": ", kHowTo));
  }
  if (!IsPrintableAscii(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster secret must be printable ASCII without spaces: ", kHowTo));
  }
  return ClusterSecret(std::move(value));
}

absl::StatusOr<ClusterSecret> ClusterSecret::Load(const std::string& file) {
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    if (!in || !(text << in.rdbuf())) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read the cluster secret file ", file));
    }
    absl::StatusOr<ClusterSecret> secret =
        Of(std::string(absl::StripAsciiWhitespace(text.str())));
    if (!secret.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", secret.status().message()));
    }
    return secret;
  }
  const char* env = std::getenv(kClusterSecretEnv);
  if (env == nullptr || *env == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat("no cluster secret: the control plane refuses unauthenticated calls; ",
                     kHowTo));
  }
  return Of(std::string(absl::StripAsciiWhitespace(env)));
}

ClusterSecret ClusterSecret::Random() { return ClusterSecret(RandomId128()); }

grpc::Status ClusterSecret::Check(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClusterSecretMetadata);
  if (it == metadata.end() ||
      !SameSecret(std::string(it->second.data(), it->second.size()), value_)) {
    spdlog::warn("control-plane call from {} refused: no cluster secret", ForLog(context.peer()));
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "control-plane call without the cluster secret");
  }
  return grpc::Status::OK;
}

void ClusterSecret::Attach(grpc::ClientContext* context) const {
  context->AddMetadata(kClusterSecretMetadata, value_);
}

}  // namespace scd
