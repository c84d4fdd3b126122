// Names the calling thread (Linux: /proc/PID/task/TID/comm, shown by top -H, gdb and the soak's
// per-name thread counts), so a thread that outlives its work can be told apart from the
// process's others. At most 15 characters are kept.
// Thread-safety: names only the calling thread.
#ifndef SCD_BASE_THREAD_NAME_H_
#define SCD_BASE_THREAD_NAME_H_

#include <string>

namespace scd {

void NameThisThread(const char* name);
// The calling thread's name ("" where it cannot be read).
std::string ThisThreadName();

}  // namespace scd

#endif  // SCD_BASE_THREAD_NAME_H_
