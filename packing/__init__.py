"""Packing: filters once at load time, input tiles (or padded slabs) on the fly, with zero padding."""
from .filters import pack_filters, packed_filters_shape, unpack_filters
from .inputs import pack_input_tile, row_copier, tile_copiers

__all__ = ["pack_filters", "packed_filters_shape", "unpack_filters", "pack_input_tile",
           "row_copier", "tile_copiers"]
