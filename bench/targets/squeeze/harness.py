"""squeeze's frozen harness: compresses corpus.txt with compressor.compress, writes $LOOPWRIGHT_OUTPUT/stream.zz."""

import os
import sys
from pathlib import Path

VALID = "LEVEL -1..9, WBITS 9..15, MEM_LEVEL 1..9, STRATEGY 0..4"


def main():
    out = os.environ.get("LOOPWRIGHT_OUTPUT")
    if not out:
        sys.exit("harness.py: LOOPWRIGHT_OUTPUT is not set (loopwright sets it to the run's output directory)")
    import compressor

    data = Path(__file__).resolve().with_name("corpus.txt").read_bytes()
    try:
        stream = compressor.compress(data)
    except (ValueError, TypeError, OverflowError) as e:   # zlib's answer to a constant out of range
        sys.exit(f"harness.py: compressor.compress failed: {type(e).__name__}: {e} (valid: {VALID})")
    if not isinstance(stream, (bytes, bytearray)):
        sys.exit(f"harness.py: compressor.compress returned {type(stream).__name__}, not bytes")
    Path(out, "stream.zz").write_bytes(bytes(stream))


if __name__ == "__main__":
    main()
