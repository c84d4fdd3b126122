// libFuzzer target: a code batch's checked wire form (codec/code_batch_wire.h). What parses must
// serialize back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "codec/code_batch_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto batch = scd::ParseCodeBatch(bytes);
  if (!batch.ok()) return 0;
  auto again = scd::ParseCodeBatch(scd::SerializeCodeBatch(*batch));
  if (!again.ok()) std::abort();  // what was accepted once must be accepted again
  return 0;
}
