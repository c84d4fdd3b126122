#include "model/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

namespace scd {
namespace {

using Json = nlohmann::json;

// Headers larger than this are rejected before allocation (the official library uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  StDtype dtype;
  std::string_view name;
  int64_t size;
  c10::ScalarType scalar;
};

constexpr DtypeInfo kDtypes[] = {
    {StDtype::kF64, "F64", 8, c10::kDouble}, {StDtype::kF32, "F32", 4, c10::kFloat},
    {StDtype::kF16, "F16", 2, c10::kHalf},   {StDtype::kBF16, "BF16", 2, c10::kBFloat16},
    {StDtype::kI64, "I64", 8, c10::kLong},   {StDtype::kI32, "I32", 4, c10::kInt},
    {StDtype::kI16, "I16", 2, c10::kShort},  {StDtype::kI8, "I8", 1, c10::kChar},
    {StDtype::kU8, "U8", 1, c10::kByte},     {StDtype::kBool, "BOOL", 1, c10::kBool},
};

const DtypeInfo& Info(StDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  return kDtypes[0];  // unreachable: every enumerator is listed
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": invalid safetensors file: ", what));
}

}  // namespace

absl::StatusOr<StDtype> ParseStDtype(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown safetensors dtype '", std::string(name), "'"));
}

std::string_view StDtypeName(StDtype dtype) { return Info(dtype).name; }
int64_t StDtypeSize(StDtype dtype) { return Info(dtype).size; }
c10::ScalarType StDtypeToScalarType(StDtype dtype) { return Info(dtype).scalar; }

absl::StatusOr<StDtype> ScalarTypeToStDtype(c10::ScalarType type) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.scalar == type) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", c10::toString(type), " cannot be stored in safetensors"));
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return Corrupt(
        path, absl::StrCat("file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;
  const auto* bytes = static_cast<const uint8_t*>(mapping);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxHeaderBytes) {
    return Corrupt(path, absl::StrCat("header length ", header_size, " exceeds the ",
                                      kMaxHeaderBytes, "-byte limit"));
  }
  if (header_size > file_size - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_size, " runs past the end of the ",
                                      file_size, "-byte file (truncated?)"));
  }
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_size);
  const uint8_t* data = bytes + 8 + header_size;
  int64_t data_size = static_cast<int64_t>(file_size - 8 - header_size);
  SCD_RETURN_IF_ERROR(file->ParseHeader(header, data_size, data));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::Status SafetensorsFile::ParseHeader(std::string_view header, int64_t data_size,
                                          const uint8_t* data) {
  Json j = Json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Corrupt(path_, "header is not a JSON object");
  }
  struct Range {
    int64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corrupt(path_, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Corrupt(path_, absl::StrCat("__metadata__.", m.key(), " is not a string"));
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto where = [&](const std::string& what) {
      return Corrupt(path_, absl::StrCat(name, ": ", what));
    };
    if (!v.is_object()) return where("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return where("missing dtype");
    absl::StatusOr<StDtype> dtype = ParseStDtype(v["dtype"].get<std::string>());
    if (!dtype.ok()) return where(std::string(dtype.status().message()));
    if (!v.contains("shape") || !v["shape"].is_array()) return where("missing shape");
    TensorEntry entry;
    entry.name = name;
    entry.dtype = *dtype;
    for (const Json& d : v["shape"]) {
      if (!d.is_number_unsigned()) return where("shape entries must be non-negative integers");
      entry.shape.push_back(d.get<int64_t>());
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
        !v["data_offsets"][1].is_number_unsigned()) {
      return where("data_offsets must be [begin, end]");
    }
    const uint64_t begin = v["data_offsets"][0].get<uint64_t>();
    const uint64_t end = v["data_offsets"][1].get<uint64_t>();
    if (begin > end)
      return where(absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > static_cast<uint64_t>(data_size)) {
      return where(absl::StrCat("data_offsets [", begin, ", ", end, "] run past the ", data_size,
                                "-byte data section (truncated file?)"));
    }
    // numel x size computed with an overflow guard: shapes are attacker-controlled.
    uint64_t expected = static_cast<uint64_t>(StDtypeSize(entry.dtype));
    for (int64_t d : entry.shape) {
      if (d != 0 && expected > (1ull << 62) / static_cast<uint64_t>(d))
        return where("shape overflows");
      expected *= static_cast<uint64_t>(d);
    }
    if (end - begin != expected) {
      return where(absl::StrCat("holds ", end - begin, " bytes but dtype ",
                                std::string(StDtypeName(entry.dtype)), " and its shape need ",
                                expected));
    }
    entry.data = data + begin;
    entry.size_bytes = static_cast<int64_t>(expected);
    auto [pos, inserted] = tensors_.emplace(name, std::move(entry));
    ranges.push_back({static_cast<int64_t>(begin), static_cast<int64_t>(end), &pos->first});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return Corrupt(path_, absl::StrCat("tensors ", *ranges[i - 1].name, " and ", *ranges[i].name,
                                         " overlap"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

const TensorEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

at::Tensor SafetensorsFile::ToTensor(const TensorEntry& entry, c10::ScalarType dtype) {
  // Copy first: tensor bytes inside the mapping need not be aligned for their type.
  at::Tensor raw =
      at::empty(entry.shape, at::TensorOptions().dtype(StDtypeToScalarType(entry.dtype)));
  if (entry.size_bytes > 0) std::memcpy(raw.data_ptr(), entry.data, entry.size_bytes);
  return raw.scalar_type() == dtype ? raw : raw.to(dtype);
}

absl::StatusOr<at::Tensor> SafetensorsFile::Load(std::string_view name,
                                                 c10::ScalarType dtype) const {
  return GuardExceptions("SafetensorsFile::Load", [&]() -> absl::StatusOr<at::Tensor> {
    const TensorEntry* entry = Find(name);
    if (entry == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(path_, ": no tensor named '", std::string(name), "'"));
    }
    return ToTensor(*entry, dtype);
  });
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

absl::Status SafetensorsWriter::Add(const std::string& name, const at::Tensor& tensor) {
  return Add(name, tensor, tensor.scalar_type());
}

absl::Status SafetensorsWriter::Add(const std::string& name, const at::Tensor& tensor,
                                    c10::ScalarType store_as) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", name, "'"));
  }
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": undefined tensor"));
  }
  SCD_RETURN_IF_ERROR(ScalarTypeToStDtype(store_as).status());
  if (tensors_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
  }
  tensors_[name] = tensor.detach().to(at::kCPU, store_as).contiguous().clone();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  return GuardExceptions("SafetensorsWriter::Write", [&]() -> absl::Status {
    Json header = Json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    int64_t offset = 0;
    for (const auto& [name, t] : tensors_) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      SCD_ASSIGN_OR_RETURN(StDtype dtype, ScalarTypeToStDtype(t.scalar_type()));
      header[name] = {{"dtype", std::string(StDtypeName(dtype))},
                      {"shape", t.sizes().vec()},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = header.dump();
    // The format pads the header with spaces so that the data section starts 8-byte aligned.
    text.append((8 - text.size() % 8) % 8, ' ');
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot open for writing"));
      uint64_t n = text.size();
      char len[8];
      for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
      out.write(len, 8);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      for (const auto& [name, t] : tensors_) {
        out.write(static_cast<const char*>(t.data_ptr()),
                  static_cast<std::streamsize>(t.numel() * t.element_size()));
      }
      out.flush();
      if (!out) return absl::DataLossError(absl::StrCat(tmp, ": write failed (disk full?)"));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  });
}

}  // namespace scd
