"""Print a micro-kernel's optimised LLVM IR and host assembly.

    python -m microkernels.dump f32_conv_ukernel_8x32__avx512 [--ir | --asm]

Kernel names are ``{f32|f64}_conv_ukernel_{Nf}x{Nwin}[_slab|_bslab]__{avx512|avx2|neon|generic}``;
``Nwin`` must be a multiple of the ISA's vector lanes. ``--cross`` compiles for the ISA's own
target on any host (``python -m microkernels.dump f32_conv_ukernel_8x8__neon --cross``).
``repr(cso.Conv2d(w))`` names the kernel a layer uses.
"""
import argparse
import sys

from . import compile
from .jit import cross_assembly
from .spec import KernelSpec


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m microkernels.dump", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="kernel name, e.g. f32_conv_ukernel_8x32__avx512")
    show = parser.add_mutually_exclusive_group()
    show.add_argument("--ir", action="store_true", help="only the optimised LLVM IR")
    show.add_argument("--asm", action="store_true", help="only the assembly")
    show.add_argument("--cross", action="store_true",
                      help="only the assembly for the ISA's own target, on any host (neon)")
    ns = parser.parse_args(argv)
    try:
        spec = KernelSpec.parse(ns.name)
        if ns.cross:
            print(cross_assembly(spec))
            return 0
        kernel = compile(spec)
    except ValueError as err:
        parser.error(str(err))
    if not ns.asm:
        print(kernel.ir)
    if not ns.ir:
        print(kernel.asm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
