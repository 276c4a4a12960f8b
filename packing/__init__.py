"""Packing: filters once at load time, input tiles on the fly (with zero padding)."""
from .filters import pack_filters, packed_filters_shape, unpack_filters
from .inputs import input_packer

__all__ = ["pack_filters", "packed_filters_shape", "unpack_filters", "input_packer"]
