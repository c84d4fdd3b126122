// ServedModelSpec: what a serving node is told to serve, as its flags give it (torch-free, so
// front ends can hold one without the runtime's headers). codec/fingerprint.h loads it.
// Thread-safety: a plain value.
#ifndef SCD_CODEC_SERVED_MODEL_SPEC_H_
#define SCD_CODEC_SERVED_MODEL_SPEC_H_

#include <cstdint>
#include <string>

namespace scd {

// What a serving node serves: a model directory, or seeded dummy weights for a real config
// (timings at real sizes, no fidelity).
// Exactly one of `model_dir` and `dummy_config`.
struct ServedModelSpec {
  std::string model_dir;     // a Hugging Face model directory
  std::string dummy_config;  // or seeded random weights for this config.json (or its directory)
  std::string name;          // routing name; "" = the directory's name (a config: its stem)
  int64_t layers = 0;        // dummy: keep only the first N layers (0: all)
  // Dummy: the weights' seed. The daemons default to scd-calib synth's defaults (producer 1,
  // consumer 2), so a synthesized artifact fits the nodes without repeating seeds.
  uint64_t seed = 0;
  std::string device = "cpu";  // cpu, cuda, cuda:N
  std::string dtype = "f32";   // f32, bf16, f16
};

}  // namespace scd

#endif  // SCD_CODEC_SERVED_MODEL_SPEC_H_
