// libFuzzer target: a code batch's checked wire form (codec/code_batch_wire.h). What parses must
// parse again after serializing. `SCD_FUZZ_WRITE_SEED=FILE` writes a small valid batch (f16 raw
// keys, int8 raw values) to FILE and exits: scripts/fuzz.sh's seed, made rather than stored.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "codec/code_batch_wire.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seed = std::getenv("SCD_FUZZ_WRITE_SEED");
  if (seed == nullptr) return 0;
  scd::CodeBatch batch;
  batch.mode = scd::TransferMode::kRaw;
  batch.tokens = 3;
  scd::CodeChunk keys;
  keys.kind = scd::PayloadKind::kRawKey;
  keys.token_end = 3;
  keys.dtype = scd::WireDtype::kF16;
  keys.shape = {1, 3, 4};
  keys.data = at::arange(12, at::kFloat).reshape({1, 3, 4}).to(at::kHalf);
  scd::CodeChunk values = keys;
  values.layer = 1;
  values.kind = scd::PayloadKind::kRawValue;
  values.dtype = scd::WireDtype::kInt8;
  values.data = at::arange(12, at::kChar).reshape({1, 3, 4});
  values.scales = at::ones({3}, at::kHalf);
  batch.chunks = {keys, values};
  std::ofstream(seed, std::ios::binary) << scd::SerializeCodeBatch(batch);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto batch = scd::ParseCodeBatch(bytes);
  if (!batch.ok()) return 0;
  auto again = scd::ParseCodeBatch(scd::SerializeCodeBatch(*batch));
  if (!again.ok()) std::abort();  // what was accepted once must be accepted again
  return 0;
}
