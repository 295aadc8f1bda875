"""The dashboard's cost on a long campaign, and whether its clients slow the loop's ledger writes.

    python bench/perf/dashboard.py [--experiments 5000] [--clients 20] [--writes 200]
    python bench/perf/dashboard.py --tiny        # a smoke run: 50 experiments, 2 clients, 5 writes

Builds a scratch workspace (LOOPWRIGHT_HOME in a temp dir; the stdlib corpus) with N recorded experiments
(4 KB log each), then prints the median seconds of: Source.version() (what the SSE loop polls), a whole
snapshot (what a page or a live refresh reads) and its rendering; and the median latency of one ledger
write (an experiment started and finished, as the loop records it) with no dashboard, and with a served
dashboard and `--clients` SSE streams open that never read.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def timed(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def write_latency(db: Path, cid: int, n: int) -> float:
    from mcp_server.ledger.store import Ledger

    with Ledger(db) as led:
        def one():
            e = led.start_experiment(cid, "bench write", status="running")
            led.update_experiment(e, status="ok", val_bpb=2.0, finished_at=time.time(), log_tail="x" * 4096)
        return timed(one, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 50 experiments, 2 stalled clients, 5 writes, a "
                    "tiny corpus (seconds; the figures mean nothing)")
    a = ap.parse_args()
    if a.tiny:
        a.experiments, a.clients, a.writes = 50, 2, 5
    tmp = Path(tempfile.mkdtemp(prefix="lw-dash-bench-"))
    os.environ["LOOPWRIGHT_HOME"] = str(tmp / "home")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import uvicorn

    from mcp_server.dashboard import app as appmod
    from mcp_server.dashboard import auth, data, views
    from mcp_server.loop.setup import init_workspace

    from conftest import FAST, make_small_corpus

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny

    corpus = tiny.tiny_corpus(tmp / "corpus") if a.tiny else make_small_corpus(tmp / "corpus")
    ws = init_workspace(tmp / "ws", tag="bench", corpus=str(corpus),
                        overrides={k: dict(v) for k, v in FAST.items()})
    led = ws.ledger()
    c = led.campaign()
    for i in range(a.experiments):
        e = led.start_experiment(c["id"], f"idea {i}: change something", commit_sha=c["best_commit"],
                                 parent_commit=c["best_commit"], seed=1000 + i % 2, is_baseline=int(i < 2))
        led.update_experiment(e, status="ok" if i % 7 else "crash", val_bpb=None if i % 7 == 0 else 2.0 - i * 1e-5,
                              verdict=None if i % 7 == 0 else ("baseline" if i < 2 else "discard"),
                              finished_at=time.time(), log_tail="step 1 loss 9.0\n" * 256)
    led.close()
    src = data.sources([ws.root])[0]
    t_version = timed(src.version, 20)
    t_snapshot = timed(lambda: data.snapshot(src), 5)
    snap = data.snapshot(src)
    t_render = timed(lambda: views.fragments(snap, False), 5)
    base = write_latency(src.db_path, c["id"], a.writes)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = appmod.create_app([src], auth.Guard("127.0.0.1", port), who="bench", poll_s=0.2)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    stalled = []
    for _ in range(a.clients):
        sk = socket.create_connection(("127.0.0.1", port))
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sk.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        stalled.append(sk)
    time.sleep(1.0)
    loaded = write_latency(src.db_path, c["id"], a.writes)
    for sk in stalled:
        sk.close()
    server.should_exit = True
    print(f"experiments {a.experiments}: version {t_version * 1e3:.2f} ms, snapshot {t_snapshot * 1e3:.0f} ms, "
          f"render {t_render * 1e3:.0f} ms; one ledger write {base * 1e3:.2f} ms alone, {loaded * 1e3:.2f} ms with "
          f"the dashboard polling every 0.2 s and {a.clients} stalled SSE clients")


if __name__ == "__main__":
    main()
