// Identifiers nobody can guess: 128 bits from the kernel's CSPRNG (getrandom), as 32 lower-case
// hex digits. Node ids, server-made request ids and transfer session ids use them, so a client
// that can see or count others' ids cannot predict the next one.
// Thread-safety: thread-safe.
#ifndef SCD_BASE_RANDOM_ID_H_
#define SCD_BASE_RANDOM_ID_H_

#include <string>

namespace scd {

// 32 hex digits (128 random bits). Aborts if the kernel has no randomness to give (never on Linux
// >= 3.17 after boot).
std::string RandomId128();

}  // namespace scd

#endif  // SCD_BASE_RANDOM_ID_H_
