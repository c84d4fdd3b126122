// What the benchmarks need of a model directory's config.json (Hugging Face names) without
// loading the model (scd-bench links no libtorch): its vocabulary, positions and the bytes of K
// and V one token takes in the daemons' float32 cache.
// Thread-safety: a stateless function.
#ifndef SCD_BENCH_MODEL_SHAPE_H_
#define SCD_BENCH_MODEL_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace scd::bench {

struct ModelShape {
  int64_t vocab_size = 0, max_position_embeddings = 0, kv_bytes_per_token = 0;
};

// MODEL/config.json's shape: NOT_FOUND without the file, INVALID_ARGUMENT when it is no JSON
// object or lacks the vocabulary, positions or layer shape.
absl::StatusOr<ModelShape> ReadModelShape(const std::string& model);

}  // namespace scd::bench

#endif  // SCD_BENCH_MODEL_SHAPE_H_
