#include "tests/test_util.h"

#include <cstdlib>

namespace scd::testing {

std::string SharedDir() {
  const char* env = std::getenv("SCD_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(SCD_SHARED_DIR);
}

}  // namespace scd::testing
