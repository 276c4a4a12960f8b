"""Packing: filters once at load time, input tiles (or padded slabs) on the fly, with zero padding."""
from .filters import pack_filters, packed_filters_shape, unpack_filters
from .inputs import input_packer, slab_filler

__all__ = ["pack_filters", "packed_filters_shape", "unpack_filters", "input_packer", "slab_filler"]
