// Where the read-only shared/ folder (models, goldens, data) is, resolved at run time:
//   1. an explicit path (a --shared-dir flag), else
//   2. $SCD_SHARED_DIR, else
//   3. `shared/` beside the checkout: the first ancestor of the running executable's directory
//      whose sibling `shared/` exists (build/bin/scd -> <checkout>/../shared), else
//   4. ../shared relative to the working directory.
// Nothing is compiled in, so a binary keeps working when the tree moves.
// Thread-safety: stateless functions.
#ifndef SCD_BASE_SHARED_DIR_H_
#define SCD_BASE_SHARED_DIR_H_

#include <string>

namespace scd {

std::string ResolveSharedDir(const std::string& flag = "");

// The running executable's directory ("" if /proc/self/exe cannot be read).
std::string ExecutableDir();

// Step 3 alone: the first ancestor of `start_dir` (itself included) with a sibling
// `shared/models/`, as that `shared/` folder; "" if none.
std::string FindSharedDirBeside(const std::string& start_dir);

}  // namespace scd

#endif  // SCD_BASE_SHARED_DIR_H_
