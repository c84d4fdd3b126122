// SHA-256 (OpenSSL's EVP digest): artifact checksums, model fingerprints, file identity; and
// HMAC-SHA256 (OpenSSL's HMAC) for tokens signed with the cluster secret.
// Thread-safety: a Sha256 object is not thread-safe; the functions are stateless.
#ifndef SCD_BASE_SHA256_H_
#define SCD_BASE_SHA256_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace scd {

// Streaming SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  std::string HexDigest();  // finishes the hash
  std::string Digest();     // finishes the hash: the 32 raw bytes

 private:
  void* ctx_;
};

// Hex SHA-256 of the bytes.
std::string Sha256Hex(std::string_view bytes);

// HMAC-SHA256 of `data` under `key`: the 32 raw bytes.
std::string HmacSha256(std::string_view key, std::string_view data);
// Whether a and b are equal, in a time that depends on their lengths only (OpenSSL's
// CRYPTO_memcmp): for comparing MACs.
bool EqualInConstantTime(std::string_view a, std::string_view b);

}  // namespace scd

#endif  // SCD_BASE_SHA256_H_
