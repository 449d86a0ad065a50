// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected = 0x82F63B78), the checksum of checkpoint
// data: the SSE4.2 crc32 instruction where the CPU has it (about 8 bytes per 3 cycles), a table
// otherwise; both give the same value. crc32c("123456789") = 0xE3069283.
#pragma once
#include <cstddef>
#include <cstdint>

namespace llmpi {

// Continue a CRC-32C over n more bytes (start with crc = 0).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace llmpi
