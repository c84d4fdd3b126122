// Shared helpers for tests: locating ../shared, reading goldens, temp dirs, running binaries.
#ifndef SCD_TESTS_TEST_UTIL_H_
#define SCD_TESTS_TEST_UTIL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "model/token_id.h"

namespace scd::testing {

// ../shared (or $SCD_SHARED_DIR when set).
std::string SharedDir();
std::string ModelDir(const std::string& name);  // SharedDir()/models/NAME
std::string BuildDir();                         // the CMake build tree

// All real checkpoints in ../shared/models that have goldens.
const std::vector<std::string>& GoldenModelNames();

struct GoldenPrompt {
  std::string text;
  std::vector<TokenId> ids;        // BOS included
  std::vector<TokenId> greedy_40;  // 40 greedy tokens after ids
};

// ../shared/golden/NAME.{json,safetensors}: prompts, float64-reference logits p{i}.logits and,
// for prompt 2, per-layer captures p2.layer{l}.{attn_input,key_prerope,value}.
struct Golden {
  std::string model;
  std::vector<GoldenPrompt> prompts;
  std::unique_ptr<SafetensorsFile> tensors;
  at::Tensor Tensor(const std::string& name) const;  // float32; fails the test when absent
};
Golden LoadGolden(const std::string& model_name);

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b);

// A fresh empty directory, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& contents);
std::string ReadFile(const std::string& path);

// Runs a shell command, capturing stdout and stderr separately.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal, if any
  std::string out, err;
};
CommandResult RunCommand(const std::string& command);

}  // namespace scd::testing

#endif  // SCD_TESTS_TEST_UTIL_H_
