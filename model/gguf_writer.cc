#include "model/gguf_writer.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace scd {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;

// GGUF metadata value types (gguf.md).
enum ValueType : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

void Q8_0Block(const float* x, std::string* out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  Put<uint16_t>(out, c10::Half(d).x);
  for (int i = 0; i < 32; ++i) Put<int8_t>(out, static_cast<int8_t>(std::roundf(x[i] * id)));
}

}  // namespace

const char* GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kBF16:
      return "BF16";
  }
  return "?";
}

uint64_t GgmlBytes(GgmlType type, uint64_t elements) {
  switch (type) {
    case GgmlType::kF32:
      return 4 * elements;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 2 * elements;
    case GgmlType::kQ8_0:
      return elements / 32 * 34;
  }
  return 0;
}

void EncodeGgml(GgmlType type, absl::Span<const float> values, std::string* out) {
  out->reserve(out->size() + GgmlBytes(type, values.size()));
  switch (type) {
    case GgmlType::kF32:
      out->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
      return;
    case GgmlType::kF16:
      for (float v : values) Put<uint16_t>(out, c10::Half(v).x);
      return;
    case GgmlType::kBF16:
      for (float v : values) Put<uint16_t>(out, c10::BFloat16(v).x);
      return;
    case GgmlType::kQ8_0:
      for (size_t i = 0; i + 32 <= values.size(); i += 32) Q8_0Block(values.data() + i, out);
      return;
  }
}

void GgufWriter::SetString(const std::string& key, const std::string& value) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kString);
  PutString(&metadata_, value);
  ++metadata_count_;
}

void GgufWriter::SetUint32(const std::string& key, uint32_t value) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kU32);
  Put<uint32_t>(&metadata_, value);
  ++metadata_count_;
}

void GgufWriter::SetFloat32(const std::string& key, float value) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kF32);
  Put<float>(&metadata_, value);
  ++metadata_count_;
}

void GgufWriter::SetBool(const std::string& key, bool value) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kBool);
  Put<uint8_t>(&metadata_, value ? 1 : 0);
  ++metadata_count_;
}

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& values) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kArray);
  Put<uint32_t>(&metadata_, kString);
  Put<uint64_t>(&metadata_, values.size());
  for (const std::string& v : values) PutString(&metadata_, v);
  ++metadata_count_;
}

void GgufWriter::SetFloat32Array(const std::string& key, const std::vector<float>& values) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kArray);
  Put<uint32_t>(&metadata_, kF32);
  Put<uint64_t>(&metadata_, values.size());
  for (float v : values) Put<float>(&metadata_, v);
  ++metadata_count_;
}

void GgufWriter::SetInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, kArray);
  Put<uint32_t>(&metadata_, kI32);
  Put<uint64_t>(&metadata_, values.size());
  for (int32_t v : values) Put<int32_t>(&metadata_, v);
  ++metadata_count_;
}

void GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                           Values values) {
  tensors_.push_back({name, std::move(shape), type, std::move(values)});
}

absl::Status GgufWriter::Write(const std::string& path) const {
  std::string header;
  Put<uint32_t>(&header, kMagic);
  Put<uint32_t>(&header, kVersion);
  Put<uint64_t>(&header, tensors_.size());
  Put<uint64_t>(&header, metadata_count_);
  header += metadata_;
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    if (t.type == GgmlType::kQ8_0 && (t.shape.empty() || !Q8_0Fits(t.shape.back()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': Q8_0 needs rows of a multiple of 32 values"));
    }
    PutString(&header, t.name);
    Put<uint32_t>(&header, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) Put<uint64_t>(&header, *d);
    Put<uint32_t>(&header, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&header, offset);
    offset += (GgmlBytes(t.type, elements) + kAlignment - 1) / kAlignment * kAlignment;
  }
  header.resize((header.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');

  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (file == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  auto write = [&](const std::string& bytes) {
    return std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  };
  bool ok = write(header);
  std::vector<float> values;
  std::string encoded;
  for (const Tensor& t : tensors_) {
    if (!ok) break;
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    values.clear();
    t.values(&values);
    if (values.size() != elements) {
      std::remove(tmp.c_str());
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", values.size(),
                                                     " values for ", elements, " elements"));
    }
    encoded.clear();
    EncodeGgml(t.type, values, &encoded);
    encoded.resize((encoded.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
    ok = write(encoded);
  }
  ok = ok && std::fflush(file.get()) == 0;
  file.reset();
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing ", path, " failed: ",
                                            ec ? ec.message() : std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace scd
