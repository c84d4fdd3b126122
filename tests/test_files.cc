#include "tests/test_files.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>

#include "base/file_util.h"
#include "base/shared_dir.h"

namespace scd::testing {

std::string SharedDir() { return ResolveSharedDir(); }

std::string ModelDir(const std::string& name) { return SharedDir() + "/models/" + name; }
std::string BuildDir() { return SCD_BUILD_DIR; }

std::string TestNameOf(std::string param) {
  for (char& c : param) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return param;
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "scd_test_XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& contents) {
  const absl::Status written = WriteStringToFile(path, contents);
  ASSERT_TRUE(written.ok()) << written;
}

std::string ReadFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  EXPECT_TRUE(contents.ok()) << contents.status();
  return contents.ok() ? *contents : std::string();
}

CommandResult RunCommand(const std::string& command) {
  TempDir dir;
  const std::string out_path = dir.File("out"), err_path = dir.File("err");
  const std::string full = command + " >" + out_path + " 2>" + err_path + " </dev/null";
  int status = std::system(full.c_str());
  CommandResult r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace scd::testing
