// libFuzzer target: a translator artifact file (safetensors structure, format version, metadata
// JSON, tensor checksum, shapes, layer routes), as every node loads it at start.
#include <cstdint>

#include "codec/artifact.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scd::fuzz::MemoryFile file(data, size);
  auto artifact = scd::Artifact::Load(file.path());
  if (artifact.ok()) (void)artifact->PatchLayers();
  return 0;
}
