"""squeeze: the editable compressor. Make the zlib stream of the frozen corpus smaller.

The constants are zlib.compressobj's parameters (https://docs.python.org/3/library/zlib.html):
LEVEL 0-9 (or -1), WBITS 9-15 (zlib container), MEM_LEVEL 1-9, STRATEGY 0-4 (Z_DEFAULT_STRATEGY,
Z_FILTERED, Z_HUFFMAN_ONLY, Z_RLE, Z_FIXED).
"""

import zlib

LEVEL = 1
WBITS = 9
MEM_LEVEL = 1
STRATEGY = 0


def compress(data):
    """One zlib stream (zlib container) that zlib.decompress turns back into data."""
    if not 9 <= WBITS <= 15:
        raise ValueError(f"WBITS must be 9..15 (a zlib stream), not {WBITS!r}")
    c = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS, MEM_LEVEL, STRATEGY)
    return c.compress(data) + c.flush()
