"""The machines the tests plan for, defined once: CPUs named for the one they model, and bare
ISAs (vector facts and tuning record on csa's fallback cache sizes)."""
import dataclasses

import csa

# AMD Zen 5: 48 KiB L1d and 1 MiB L2 per core, 32 MiB L3, AVX-512 (32 zmm registers)
ZEN5 = csa.Machine(l1d=48 * 1024, l2=1 << 20, l3=32 << 20, vector_bytes=64, vector_registers=32,
                   tuning=csa.tuning.AVX512)
# ZEN5 with its L3 shared by 16 CPUs, as on one Zen 5 CCD (8 cores, 2 threads each)
ZEN5_CCD = dataclasses.replace(ZEN5, l3_cpus=16)
# AMD Zen 3: 32 KiB L1d and 512 KiB L2 per core, 32 MiB L3, AVX2 (16 ymm registers)
ZEN3 = csa.Machine(l1d=32 * 1024, l2=512 * 1024, l3=32 << 20, vector_bytes=32,
                   vector_registers=16, tuning=csa.tuning.AVX2)
# a small what-if machine so that no clamping hides the formulas, AVX-512
SMALL = csa.Machine(l1d=32 * 1024, l2=64 * 1024, l3=256 * 1024, line=64, vector_bytes=64,
                    vector_registers=32, tuning=csa.tuning.AVX512)
AVX512 = csa.Machine(vector_bytes=64, vector_registers=32, tuning=csa.tuning.AVX512)
AVX2 = csa.Machine(vector_bytes=32, vector_registers=16, tuning=csa.tuning.AVX2)
NEON = csa.Machine(vector_bytes=16, vector_registers=32, tuning=csa.tuning.NEON)
