// Fuzzing builds. The fuzz tree (scripts/fuzz.sh) defines FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION,
// the libFuzzer convention, so that parsers accept any checksum and the fuzzer reaches what the
// checksums guard (a mutated input almost never carries a matching CRC or SHA-256); every other
// build checks them. Nothing else differs.
#ifndef SCD_BASE_FUZZING_H_
#define SCD_BASE_FUZZING_H_

namespace scd {

#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
inline constexpr bool kChecksumsChecked = false;
#else
inline constexpr bool kChecksumsChecked = true;
#endif

}  // namespace scd

#endif  // SCD_BASE_FUZZING_H_
