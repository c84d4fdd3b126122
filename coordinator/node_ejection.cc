#include "coordinator/node_ejection.h"

#include <utility>

namespace scd::coordinator {

void Eject(Ejection* e, absl::Time now, std::string why) {
  if (!e->out) {
    e->since = now;
    ++e->ejections;
  }
  e->out = true;
  e->why = std::move(why);
  e->passes = 0;
  if (!e->probing) e->next_probe = now;
}

bool TakeProbe(Ejection* e, absl::Time now) {
  if (!e->out || e->probing || now < e->next_probe) return false;
  e->probing = true;
  return true;
}

bool ProbeAnswered(Ejection* e, bool ok, absl::Time now) {
  e->probing = false;
  e->next_probe = now + kProbeInterval;
  if (!e->out) return false;
  e->passes = ok ? e->passes + 1 : 0;
  if (e->passes < kProbesToReturn) return false;
  e->out = false;
  e->passes = 0;
  return true;
}

}  // namespace scd::coordinator
