"""Packing: filters once at load time, input tiles (or padded slabs) on the fly, with zero padding."""
from .filters import (merge_groups, other_group, pack_filters, packed_filters_shape,
                      repack_filters, unpack_filters)
from .inputs import pack_input_tile, row_copier, tile_copiers
from microkernels.cache import include_sources

__all__ = ["merge_groups", "other_group", "pack_filters", "packed_filters_shape",
           "repack_filters", "unpack_filters", "pack_input_tile", "row_copier", "tile_copiers"]

include_sources(__name__)   # its input packers are cached
