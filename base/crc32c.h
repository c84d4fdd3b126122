// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum on every serialized code
// chunk. Uses the SSE4.2 crc32 instruction when the CPU has it, with AVX2 carry-less-multiply
// folding beside it on large inputs when the CPU has VPCLMULQDQ (both checked once at run time;
// the build needs no -m flags), else a table.
// Thread-safety: stateless functions.
#ifndef SCD_BASE_CRC32C_H_
#define SCD_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace scd {

// Extends `crc` (the CRC-32C of earlier bytes, 0 to start) with `size` bytes.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// Copies `size` bytes from `src` to `dst` (not overlapping) and extends `crc` with them in the same
// pass: a receiver that copies arriving bytes anyway gets their checksum for the price of the copy.
uint32_t Crc32cCopy(void* dst, const void* src, size_t size, uint32_t crc = 0);
// The implementations, for tests; Crc32c picks one.
uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t crc = 0);
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc = 0);  // REQUIRES: SSE4.2
bool Crc32cIsHardware();
// Three crc32 streams beside AVX2 carry-less-multiply folding (CPUs with VPCLMULQDQ); Crc32c uses
// it for inputs of at least a block (22 KiB).
uint32_t Crc32cFused(const void* data, size_t size, uint32_t crc = 0);  // REQUIRES: IsFused
bool Crc32cIsFused();

}  // namespace scd

#endif  // SCD_BASE_CRC32C_H_
