#include "coordinator/node_ejection.h"

#include <utility>

namespace scd::coordinator {

void Eject(Ejection* e, absl::Time now, std::string why) {
  if (!e->out) {
    e->since = now;
    ++e->ejections;
  }
  e->out = true;
  e->suspect = false;
  e->why = std::move(why);
  e->passes = 0;
  if (!e->probing) e->next_probe = now;
}

bool Advise(Ejection* e, absl::Time now) {
  if (e->out || e->suspect) return false;
  e->suspect = true;
  if (!e->probing) e->next_probe = now;
  return true;
}

bool TakeProbe(Ejection* e, absl::Time now) {
  if (!(e->out || e->suspect) || e->probing || now < e->next_probe) return false;
  e->probing = true;
  return true;
}

ProbeOutcome ProbeAnswered(Ejection* e, bool ok, absl::Time now, const std::string& why) {
  e->probing = false;
  e->next_probe = now + kProbeInterval;
  if (e->suspect) {
    e->suspect = false;
    if (ok) return ProbeOutcome::kCleared;
    Eject(e, now, why);
    return ProbeOutcome::kEjected;
  }
  if (!e->out) return ProbeOutcome::kNone;
  e->passes = ok ? e->passes + 1 : 0;
  if (e->passes < kProbesToReturn) return ProbeOutcome::kNone;
  e->out = false;
  e->passes = 0;
  return ProbeOutcome::kBack;
}

}  // namespace scd::coordinator
