"""Print a generated kernel's optimised LLVM IR and host assembly.

    python -m microkernels.dump f32_conv_ukernel_8x32__avx512 [--ir | --asm | --cross]

Any family's name (``microkernels.spec``): outer-product micro-kernels
``{f32|f64}_conv_ukernel_{broadcasts}x{width}[_slab|_direct]__{isa}`` (``width`` a multiple of
the ISA's vector lanes), depthwise ``f32_dw_ukernel_4v__avx2``, transposes
``f32_transpose_8x8__avx2``, packing copies ``f32_row_copy_21__avx2`` and
``f32_tap_copy_16__avx2``, activations ``f32_activation_gelu__avx2``. ``--cross`` compiles
for the ISA's own target on any host (``python -m microkernels.dump f32_conv_ukernel_8x8__neon
--cross``). A layer's outer-product or depthwise kernel is ``cso.Conv2d(w).kernel_for(x.shape)``;
its ``name`` goes here.
"""
import argparse
import sys

from .jit import cross_assembly
from .spec import parse_name
from .wrappers import compile, generator


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
        spec = parse_name(ns.name)
        if ns.cross:
            print(cross_assembly(generator(spec), spec))
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
