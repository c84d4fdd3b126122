#include "model/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat(dir, ": model directory does not exist"));
  }
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  const fs::path index_path = fs::path(dir) / kIndexFile;
  const fs::path single_path = fs::path(dir) / kSingleFile;
  if (fs::exists(index_path)) {
    ckpt->index_used_ = true;
    SCD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path.string()));
    Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not valid JSON"));
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": weight_map: required object is missing"));
    }
    std::map<std::string, SafetensorsFile*> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map.", it.key(), ": expected a file name"));
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map.", it.key(), ": shard '", shard,
                         "' must be a file name inside the model directory"));
      }
      auto found = shards.find(shard);
      if (found == shards.end()) {
        SCD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((fs::path(dir) / shard).string()));
        found = shards.emplace(shard, file.get()).first;
        ckpt->files_.push_back(std::move(file));
      }
      const TensorEntry* entry = found->second->Find(it.key());
      if (entry == nullptr) {
        return absl::DataLossError(absl::StrCat(index_path.string(), ": maps '", it.key(), "' to ",
                                                shard, ", which does not contain it"));
      }
      ckpt->entries_[it.key()] = entry;
    }
    return ckpt;
  }
  if (!fs::exists(single_path)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kSingleFile, " nor ", kIndexFile, " found"));
  }
  SCD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path.string()));
  for (const std::string& name : file->names()) ckpt->entries_[name] = file->Find(name);
  ckpt->files_.push_back(std::move(file));
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

const TensorEntry* Checkpoint::Find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

absl::StatusOr<at::Tensor> Checkpoint::Load(std::string_view name, c10::ScalarType dtype) const {
  return GuardExceptions("Checkpoint::Load", [&]() -> absl::StatusOr<at::Tensor> {
    const TensorEntry* entry = Find(name);
    if (entry == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(dir_, ": checkpoint has no tensor '", std::string(name), "'"));
    }
    return SafetensorsFile::ToTensor(*entry, dtype);
  });
}

}  // namespace scd
