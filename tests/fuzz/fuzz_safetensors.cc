// libFuzzer target: a .safetensors file from outside (its 8-byte header length, the JSON header,
// the tensors' dtypes, shapes and offsets against the data). Whatever Open accepts must be safe to
// read: every tensor is loaded (converted to float32).
#include <cstdint>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scd::fuzz::MemoryFile file(data, size);
  auto opened = scd::SafetensorsFile::Open(file.path());
  if (!opened.ok()) return 0;
  for (const std::string& name : (*opened)->names()) {
    const scd::TensorEntry* entry = (*opened)->Find(name);
    if (entry == nullptr || entry->numel() > (int64_t{1} << 22)) continue;
    (void)(*opened)->Load(name, c10::ScalarType::Float);
  }
  return 0;
}
