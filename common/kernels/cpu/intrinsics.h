// <immintrin.h> for the ISA-specific kernel files. GCC 12's AVX-512 intrinsics start from
// _mm512_undefined_*(), which -Wmaybe-uninitialized (and, for _mm512_reduce_max_ps,
// -Wuninitialized) reports once inlined (GCC bug 105593); the warning points into the header,
// so it is silenced there.
#pragma once

#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
