// CRC32C (Castagnoli), as iSCSI, ext4 and LevelDB use it: detects every change of up
// to 32 consecutive bits, so every single-byte corruption of a checked file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pskv {

/// The CRC32C of `n` bytes at `p`, continuing `crc` (0 to start): Crc32c(b, Crc32c(a))
/// is the CRC32C of a followed by b. Uses the CPU's instruction where it has one.
uint32_t Crc32c(const void* p, size_t n, uint32_t crc = 0);

}  // namespace pskv
