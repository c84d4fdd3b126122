#include "base/grpc_tls.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/grpc_library.h"
#include "base/host_port.h"
#include "base/status_macros.h"

namespace scd {
namespace {

struct LoadedTls {
  TlsFiles files;
  std::string cert_pem, key_pem, ca_pem;
};

LoadedTls& Loaded() {
  static LoadedTls* loaded = new LoadedTls();
  return *loaded;
}

absl::Status ReadPem(const std::string& flag, const std::string& path, const char* marker,
                     std::string* out) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", text.status().message()));
  }
  if (!absl::StrContains(*text, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": no PEM block (expected \"", marker, "\")"));
  }
  *out = *std::move(text);
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<int> AddTlsListeningPort(grpc::ServerBuilder* builder, const std::string& listen) {
  auto port = std::make_shared<int>(0);
  std::string address = listen;
  if (absl::StartsWith(address, ":")) address = "[::]" + address;
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder->AddListeningPort(address, GrpcServerCredentials(), port.get());
  return port;
}

absl::Status ConfigureTls(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (files.require_client_cert && (files.ca.empty() || files.cert.empty())) {
    return absl::InvalidArgumentError(
        "--tls-require-client-cert needs --tls-ca (to verify clients) and --tls-cert/--tls-key");
  }
  if (!files.server_name.empty()) {
    if (!files.enabled()) {
      return absl::InvalidArgumentError(
          "--tls-server-name needs TLS on (--tls-ca, or --tls-cert/--tls-key)");
    }
    SCD_RETURN_IF_ERROR(CheckHost(files.server_name, "--tls-server-name"));
  }
  LoadedTls loaded;
  loaded.files = files;
  if (absl::Status s = ReadPem("--tls-cert", files.cert, "-----BEGIN CERTIFICATE-----",
                               &loaded.cert_pem);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPem("--tls-key", files.key, "PRIVATE KEY-----", &loaded.key_pem);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPem("--tls-ca", files.ca, "-----BEGIN CERTIFICATE-----",
                               &loaded.ca_pem);
      !s.ok()) {
    return s;
  }
  Loaded() = std::move(loaded);
  return absl::OkStatus();
}

const TlsFiles& ConfiguredTls() { return Loaded().files; }

bool ServesTls() { return !Loaded().cert_pem.empty(); }

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials() {
  HoldGrpcLibrary();  // the server these are for may be the process's last gRPC object
  const LoadedTls& tls = Loaded();
  if (tls.cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      tls.files.require_client_cert
          ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& address,
                                              grpc::ChannelArguments args) {
  HoldGrpcLibrary();  // a call's reactor may drop the channel's last reference on gRPC's thread
  const LoadedTls& tls = Loaded();
  if (!tls.files.enabled()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;  // "" = gRPC's default roots
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  // gRPC checks the certificate for this name and sends it as the TLS SNI and :authority.
  if (!tls.files.server_name.empty()) args.SetSslTargetNameOverride(tls.files.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

}  // namespace scd
