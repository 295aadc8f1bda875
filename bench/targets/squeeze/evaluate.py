"""squeeze's frozen evaluator: decompresses the run's stream.zz with stdlib zlib (bounded, so a
decompression bomb is refused), checks it against the hidden sha256 of the corpus; metric = stream bytes."""

import hashlib
import json
import os
import zlib
from pathlib import Path

MAX_STREAM = 4_000_000   # far above what any zlib setting makes of the corpus


def verdict():
    want = json.loads(Path(__file__).resolve().parent.joinpath("hidden", "expected.json").read_text())
    path = Path(os.environ["LOOPWRIGHT_OUTPUT"], "stream.zz")
    if not path.is_file():
        return {"ok": False, "reason": "the run wrote no stream.zz"}
    if path.stat().st_size > MAX_STREAM:
        return {"ok": False, "reason": f"stream.zz is over {MAX_STREAM} bytes"}
    stream = path.read_bytes()
    d = zlib.decompressobj(wbits=15)
    try:
        text = d.decompress(stream, want["bytes"] + 1)
    except zlib.error as e:
        return {"ok": False, "reason": f"stream.zz is not a zlib stream: {e}"}
    if len(text) > want["bytes"] or d.unconsumed_tail:
        return {"ok": False, "reason": f"stream.zz decompresses to more than the corpus's {want['bytes']} bytes"}
    if not d.eof:
        return {"ok": False, "reason": "stream.zz is truncated (the zlib stream does not end)"}
    if d.unused_data:
        return {"ok": False, "reason": f"stream.zz has {len(d.unused_data)} bytes after the end of the zlib stream"}
    if hashlib.sha256(text).hexdigest() != want["sha256"]:
        return {"ok": False, "reason": f"stream.zz decompresses to {len(text)} bytes that are not the corpus"}
    return {"ok": True, "metric": float(len(stream)), "ratio": round(len(text) / len(stream), 4)}


if __name__ == "__main__":
    print(json.dumps(verdict()))
