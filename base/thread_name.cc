#include "base/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace scd {

void NameThisThread(const char* name) {
  char truncated[16] = {};
  std::strncpy(truncated, name, sizeof(truncated) - 1);
  pthread_setname_np(pthread_self(), truncated);
}

std::string ThisThreadName() {
  char name[16] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return "";
  return name;
}

}  // namespace scd
