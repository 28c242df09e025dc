// The operand of AMX's LDTILECFG (palette 1): per tile, its rows and its bytes per row. Shared by
// the tile kernels (linear_amx.cc) and the benchmark that times their instructions.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

}  // namespace tandem::kernels::cpu
