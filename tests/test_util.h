// Shared helpers for tests: locating ../shared and reading goldens.
#ifndef SCD_TESTS_TEST_UTIL_H_
#define SCD_TESTS_TEST_UTIL_H_

#include <string>

namespace scd::testing {

// ../shared (or $SCD_SHARED_DIR when set).
std::string SharedDir();

}  // namespace scd::testing

#endif  // SCD_TESTS_TEST_UTIL_H_
