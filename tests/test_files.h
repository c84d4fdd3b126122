// Torch-free test helpers: locating ../shared and the build tree, files, temp dirs, commands.
// Tokenizer tests use these without linking libtorch.
#ifndef SCD_TESTS_TEST_FILES_H_
#define SCD_TESTS_TEST_FILES_H_

#include <stdexcept>
#include <string>

namespace scd::testing {

// The shared folder: $SCD_SHARED_DIR, else shared/ beside the checkout (base/shared_dir.h).
std::string SharedDir();
std::string ModelDir(const std::string& name);  // SharedDir()/models/NAME
std::string BuildDir();                         // the CMake build tree

// A parameter such as "tinystories-4m@int8" as a GoogleTest name: "tinystories_4m_int8".
std::string TestNameOf(std::string param);

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

// The value of a StatusOr, or a thrown std::runtime_error carrying its status: GoogleTest reports
// it as a failure of the running test ("C++ exception ... thrown in the test body") instead of
// undefined behaviour. For set-up lines such as `auto model = Ok(LlamaModel::Load(dir, {}));`.
template <typename StatusOrT>
auto Ok(StatusOrT&& result) -> typename std::decay_t<StatusOrT>::value_type {
  if (!result.ok()) throw std::runtime_error(std::string(result.status().ToString()));
  return *std::forward<StatusOrT>(result);
}

// Runs a shell command, capturing stdout and stderr separately.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal, if any
  std::string out, err;
};
CommandResult RunCommand(const std::string& command);

// A loopback TCP port nothing listens on now (for servers that cannot report a port they picked,
// such as Prometheus and etcd; a race with other processes is possible, and unlikely).
int FreeLoopbackPort();

}  // namespace scd::testing

#endif  // SCD_TESTS_TEST_FILES_H_
