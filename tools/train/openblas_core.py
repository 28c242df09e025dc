"""Chooses OpenBLAS's kernels for this processor; import it before numpy or torch.

OpenBLAS's SkylakeX kernels are several times faster than the Haswell ones the machine may
preset, but they use AVX-512 and die with an illegal instruction on a processor without it
(AMD Zen 3, for one). An OPENBLAS_CORETYPE already in the environment wins.
"""
import os


def _has_avx512f():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


if _has_avx512f():
    os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
