"""The live dashboard (mcp_server/dashboard/): HTTP-level tests through Starlette's TestClient, then a real
uvicorn server driven by headless chromium (selenium + Debian's chromedriver): the page, the token, CSRF and
cross-site refusals, a hostile description shown as text, Approve through loop/decisions.py, and the chart
updating when a real tiny run finishes while another client holds an SSE stream open without reading it.

Ledgers are built directly (real Ledger, real git workspace); only the last test trains (a tiny model)."""
from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_approvals import fake_candidate, set_setting

from mcp_server.cli.main import main as cli_main
from mcp_server.dashboard import app as appmod
from mcp_server.dashboard import auth, data
from mcp_server.guard.policy import HUMAN_COMMANDS
from mcp_server.loop import gitops
from mcp_server.loop.engine import Engine

from conftest import BENCH, hobbled_bench, make_workspace, record_baseline

REPO = Path(__file__).resolve().parents[2]
# the screenshots docs/dashboard.md shows are refreshed only when asked (LOOPWRIGHT_DOC_SHOTS=1); otherwise a run
# writes them to a temporary folder, so the suite never rewrites tracked files
SHOTS = REPO / "docs" if os.environ.get("LOOPWRIGHT_DOC_SHOTS") == "1" else Path(tempfile.mkdtemp(prefix="lw-shots-"))
HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script> & "quotes"'
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def build(tmp: Path, corpus: Path, tag: str = "t", **overrides):
    """A workspace under approve-keeps: a measured baseline, a discard with a hostile description, a crash,
    and a keep that waits for a person (approval #1). No training."""
    ws = make_workspace(tmp / "ws", corpus, tag=tag, **overrides)
    set_setting(ws.root, "campaign.autonomy", "approve-keeps")
    with Engine(ws.root) as eng:
        base = record_baseline(eng)
        c = eng.campaign
        bad = fake_candidate(eng, 2.04, lr="0.0003", desc=HOSTILE)
        ref = eng.ledger.experiment(base[0])
        eng.ledger.update_experiment(bad, log_tail="step 1 loss 9.0\n</pre><b>bold?</b>", hypothesis=HOSTILE,
                                     seed=ref["seed"], paired_with=ref["id"], role="candidate")
        eng.score(bad)
        gitops.reset_to(ws.root, c["best_commit"])
        crash = eng.ledger.start_experiment(c["id"], "a crash", commit_sha=c["best_commit"],
                                            parent_commit=c["best_commit"])
        eng.ledger.update_experiment(crash, status="crash", reason="Traceback: boom", finished_at=time.time())
        keep = fake_candidate(eng, 1.80, lr="0.005", desc="raise the learning rate")
        assert eng.score(keep).verdict == "pending_approval"
    return ws


def make_app(ws, read_only: bool = False, host: str = "127.0.0.1", port: int = 8377, **kw):
    guard = auth.Guard(host, port, read_only=read_only, **kw)
    return appmod.create_app(data.sources([ws.root]), guard, who="ana", poll_s=0.2), guard


def client(app, port: int = 8377) -> TestClient:
    return TestClient(app, base_url=f"http://127.0.0.1:{port}")


def approval(ws, aid: int = 1) -> dict:
    with Engine(ws.root, read_only=True) as eng:
        return eng.ledger.approval(aid)


@pytest.fixture()
def ws(tmp_path, small_corpus):
    """A workspace of its own, for a test that decides or changes settings."""
    return build(tmp_path, small_corpus)


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory, small_corpus):
    """One workspace for the tests that only look (or are refused): built once, never changed."""
    return build(tmp_path_factory.mktemp("shared"), small_corpus, tag="t")


# --------------------------------------------------------------------------- HTTP level

def test_page_shows_the_campaign_and_escapes_agent_text(shared_ws):
    app, guard = make_app(shared_ws)
    with client(app) as cl:
        r = cl.get("/", follow_redirects=True)
        assert r.status_code == 200 and r.url.path == "/w/0/"
        page = r.text
        for shown in ("Campaign t", "waiting on a person", "approve-keeps", "raise the learning rate", "MDE",
                      "local, parallel"):
            assert shown in page, shown
        assert HOSTILE not in page and "<img src=x" not in page and "<script>document" not in page
        assert "&lt;img src=x onerror=&quot;document.title=&#x27;pwned&#x27;&quot;&gt;" in page
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        # the decision form carries no secret: the page's script adds the token this browser holds
        assert "approval-1" in page and '<input type="hidden" name="token" value="">' in page
        assert guard.token not in page and "printed at start" in page and "set-cookie" not in r.headers
        # the chart has one point per measured or failed candidate, each naming its experiment and verdict
        assert page.count('class="pt"') == 3 and "#3 discard" in page
        # the experiment page: paired runs with seeds, the verdict reason, the diff, the log tail, all escaped
        with Engine(shared_ws.root, read_only=True) as eng:
            bad = next(e for e in eng.ledger.experiments(eng.campaign["id"]) if e["description"] == HOSTILE)
            ref = eng.ledger.experiment(bad["paired_with"])
            brief = eng.ledger.experiments_brief(eng.campaign["id"])      # what the chart reads: no logs
            assert [r["id"] for r in brief] == [r["id"] for r in eng.ledger.experiments(eng.campaign["id"])]
            assert "log_tail" not in brief[0] and "metrics_json" not in brief[0]
        d = cl.get(f"/w/0/experiments/{bad['id']}")
        assert d.status_code == 200
        bundled_lr = re.search(r"^LR = (\S+)", (BENCH / "train.py").read_text(), re.M).group(1)
        assert f"-LR = {bundled_lr}" in d.text and "+LR = 0.0003" in d.text
        assert "&lt;/pre&gt;&lt;b&gt;bold?&lt;/b&gt;" in d.text and "<b>bold?" not in d.text
        assert f"<td>{ref['seed']}</td>" in d.text and f"#{ref['id']}" in d.text and "+0.0400" in d.text
        assert "Not replayed" in d.text
        assert HOSTILE not in d.text and bad["id"] and "paired" in d.text
        assert cl.get("/w/0/experiments/999").status_code == 404
        assert cl.get("/w/7/").status_code == 404
        frag = cl.get("/w/0/fragments").json()
        assert set(frag["parts"]) == {"overview", "chart", "approvals", "experiments"} and HOSTILE not in json.dumps(frag)


def post(cl: TestClient, guard, aid: int = 1, origin: str | None = "http://127.0.0.1:8377", token: str | None = None,
         **form):
    headers = {"Origin": origin} if origin else {}
    return cl.post(f"/w/0/approvals/{aid}", data={"token": guard.token if token is None else token, **form},
                   headers=headers)


def test_a_decision_needs_the_token_in_the_form_and_a_same_origin_request(ws):
    app, guard = make_app(ws)
    with client(app) as cl:
        r = post(cl, guard, token="", decision="approve")
        assert r.status_code == 403 and "no dashboard token" in r.text
        r = post(cl, guard, token=guard.token[:-1] + "x", decision="approve")
        assert r.status_code == 403 and "wrong dashboard token" in r.text
        # the right token from a foreign page (Origin), from nowhere, or flagged cross-site by the browser
        r = post(cl, guard, origin="http://evil.example", decision="approve")
        assert r.status_code == 403 and "cross-site" in r.text
        r = post(cl, guard, origin="http://127.0.0.1:9999", decision="approve")     # another local port
        assert r.status_code == 403 and "cross-site" in r.text
        r = post(cl, guard, origin=None, decision="approve")
        assert r.status_code == 403 and "Origin" in r.text
        r = cl.post("/w/0/approvals/1", data={"token": guard.token, "decision": "approve"},
                    headers={"Origin": "http://127.0.0.1:8377", "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        # DNS rebinding: a name this server does not answer to is refused before anything runs
        assert cl.get("/w/0/", headers={"Host": "attacker.example:8377"}).status_code == 421
        assert approval(ws)["status"] == "pending"
        # a reject needs a reason; then the real decision, recorded once, via the dashboard
        assert post(cl, guard, decision="reject").status_code == 409
        r = post(cl, guard, decision="reject", note="not convinced <b>")
        assert r.status_code == 200 and "rejected by ana" in r.text
        a = approval(ws)
        assert (a["status"], a["decided_by"], a["decided_via"], a["decision_note"]) == \
            ("rejected", "ana", "dashboard", "not convinced <b>")
        r = post(cl, guard, decision="approve")
        assert r.status_code == 409 and "already decided" in r.text
    with Engine(ws.root, read_only=True) as eng:
        assert len(eng.ledger.events(kind="approval_decided")) == 1
        assert eng.campaign["best_experiment_id"] is None


def test_approve_goes_through_the_decision_code_and_moves_the_best(ws):
    app, guard = make_app(ws)
    with Engine(ws.root, read_only=True) as eng:
        keep = eng.ledger.approval(1)
    with client(app) as cl:
        r = post(cl, guard, decision="approve", note="looks right")
        assert r.status_code == 200, r.text
        app.state.appliers.join(60)
    a = approval(ws)
    assert (a["status"], a["decided_via"], a["decided_by"]) == ("applied", "dashboard", "ana")
    with Engine(ws.root, read_only=True) as eng:
        c = eng.campaign
        assert c["best_commit"] == keep["commit_sha"] and c["best_experiment_id"] == keep["experiment_id"]
        assert eng.ledger.experiment(keep["experiment_id"])["verdict"] == "keep"
        assert [e["payload"]["approval_id"] for e in eng.ledger.events(kind="approval_decided")] == [1]
    assert gitops.head_sha(ws.root) == keep["commit_sha"]
    # a replay of the kept change shows on its page: per fresh seed, parent and child, and the outcome
    with Engine(ws.root, read_only=True) as eng:
        cid, eid = eng.campaign["id"], keep["experiment_id"]
        for seed, parent, child in ((2001, 2.00, 1.81), (2002, 2.01, 1.83)):
            eng.ledger.add_replay_run(cid, 1, eid, "parent", keep["base_commit"], seed, "ok", parent, 4, None, time.time())
            eng.ledger.add_replay_run(cid, 1, eid, "child", keep["commit_sha"], seed, "ok", child, 4, None, time.time())
    with client(app) as cl:
        page = cl.get(f"/w/0/experiments/{eid}").text
    assert "Replay #1: <b>holds</b>, mean paired gain +0.1850" in page
    assert "<td>2001</td><td>2.0000</td><td>1.8100</td><td>-0.1900</td>" in page


def test_read_only_mode_changes_nothing(shared_ws):
    app, guard = make_app(shared_ws, read_only=True)
    with client(app) as cl:
        page = cl.get("/w/0/").text
        assert "<form" not in page and "read-only" in page
        r = post(cl, guard, decision="approve")
        assert r.status_code == 403 and "read-only" in r.text
    assert approval(shared_ws)["status"] == "pending"


def test_binding_beyond_loopback_needs_a_flag_and_a_login(shared_ws):
    with pytest.raises(auth.AuthError, match="--allow-remote"):
        auth.Guard.for_binding("0.0.0.0", 8377, allow_remote=False, read_only=False, env={})
    with pytest.raises(auth.AuthError, match=auth.PASSWORD_ENV):
        auth.Guard.for_binding("10.1.2.3", 8377, allow_remote=True, read_only=False, env={auth.PASSWORD_ENV: "short"})
    assert auth.Guard.for_binding("::1", 8377, False, False, env={}).password is None
    guard = auth.Guard.for_binding("10.1.2.3", 8377, allow_remote=True, read_only=False,
                                   env={auth.PASSWORD_ENV: "a long enough password"})
    app = appmod.create_app(data.sources([shared_ws.root]), guard, who="ana")
    with TestClient(app, base_url="http://10.1.2.3:8377") as cl:
        r = cl.get("/w/0/")
        assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]
        bad = base64.b64encode(b"ana:wrong").decode()
        assert cl.get("/w/0/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        good = base64.b64encode(b"ana:a long enough password").decode()
        assert cl.get("/w/0/", headers={"Authorization": f"Basic {good}"}).status_code == 200


def test_the_cli_refuses_bad_bindings_and_the_guard_refuses_the_agent(shared_ws, capsys):
    assert cli_main(["dashboard", "--workspace", str(shared_ws.root), "--host", "0.0.0.0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert cli_main(["dashboard", "--workspace", str(shared_ws.root), "--all"]) == 2
    assert cli_main(["dashboard", "--workspace", str(shared_ws.root), "--port", "0"]) == 2
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capsys.readouterr()
        assert cli_main(["dashboard", "--workspace", str(shared_ws.root), "--port", str(port)]) == 2
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert "dashboard" in HUMAN_COMMANDS
    from test_guard import decide, payload

    for cmd in ("loopwright dashboard", "loopwright dashboard --read-only --port 9000",
                "python3 -m mcp_server.cli dashboard", "env bash -c 'loopwright dashboard'"):
        d = decide(payload("claude", shared_ws.root, "Bash", {"command": cmd}))
        assert not d.allow, cmd


def test_the_command_prints_a_url_with_the_token_and_serves(ws):
    """`loopwright dashboard` for real: the printed URL logs this client in; the token is in no file."""
    import os
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mcp_server.cli", "dashboard", "--workspace", str(ws.root),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        url = wait_for(lambda: next((w for w in proc.stdout.readline().split() if w.startswith("http://")), None),
                       timeout=60, what="the printed URL")
        assert url.startswith(f"http://127.0.0.1:{port}/#token=")
        token = url.split("token=", 1)[1]
        opener = urllib.request.build_opener()
        page = wait_for(lambda: _get(opener, url), timeout=30, what="the page")
        assert "raise the learning rate" in page and token not in page
        decide = f"http://127.0.0.1:{port}/w/0/approvals/1"
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(urllib.request.Request(decide, data=f"decision=approve&token={token}".encode(),
                                               headers={"Origin": "http://evil.example"}), timeout=10)
        assert refused.value.code == 403
        r = opener.open(urllib.request.Request(decide, data=f"decision=reject&note=later&token={token}".encode(),
                                               headers={"Origin": f"http://127.0.0.1:{port}"}), timeout=30)
        assert r.status == 200 and approval(ws)["decided_via"] == "dashboard"
        stored = [p for p in ws.state_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert stored == [] and token not in (ws.root / ".loopwright").joinpath("workspace-id").read_text()
    finally:
        proc.terminate()
        proc.wait(20)


def _get(opener, url: str):
    import urllib.error

    try:
        return opener.open(url, timeout=10).read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def test_a_campaign_on_ray_shows_its_cluster_runs_in_flight_and_workers(ws):
    """The executor view comes from the ledger alone (no cluster is contacted): the address, the runs in
    flight with their attempts, and the workers that ran the finished ones."""
    set_setting(ws.root, "executor.kind", "ray")
    set_setting(ws.root, "executor.address", "ray://10.0.0.5:10001")
    set_setting(ws.root, "executor.parallel", "4")
    with Engine(ws.root, read_only=True) as eng:
        c = eng.campaign
        done = eng.ledger.experiments(c["id"])[-1]
        eng.ledger.update_experiment(done["id"], metrics_json=json.dumps({"worker": "ray:node7:gpu-host-3"}))
        run = eng.ledger.start_experiment(c["id"], "in flight on the cluster", commit_sha=c["best_commit"],
                                          parent_commit=c["best_commit"], seed=1234, role="candidate")
        eng.ledger.add_inflight(run, c["id"], "ray", attempt=2)
    app, _ = make_app(ws)
    with client(app) as cl:
        page = cl.get("/w/0/").text
    assert "ray at ray://10.0.0.5:10001, parallel 4" in page and "ray:node7:gpu-host-3 (1 runs" in page
    assert "<dt>in flight</dt><dd>1</dd>" in page and "<span class=\"state state-running\">running</span>" in page


def test_the_dashboard_never_recovers_or_locks(ws):
    """A `running` row with no live run behind it: the dashboard (the engine opened read-only) shows it and
    leaves it; the next writer (Engine.open_for_writing) is the one that recovers it."""
    from mcp_server.common.locks import FileLock

    with Engine(ws.root, read_only=True) as eng:
        c = eng.campaign
        orphan = eng.ledger.start_experiment(c["id"], "killed with -9", commit_sha=c["best_commit"],
                                             parent_commit=c["best_commit"])
    app, _ = make_app(ws)
    held = FileLock(ws.state_dir / "server.lock").try_acquire()   # as a live run holds it
    assert held is not None
    with held:
        with client(app) as cl:
            assert "running" in cl.get("/w/0/").text
    with Engine(ws.root, read_only=True) as eng:
        assert eng.ledger.experiment(orphan)["status"] == "running"
    with Engine.open_for_writing(ws.root) as eng:   # the next writer recovers it
        assert eng.ledger.experiment(orphan)["status"] == "interrupted"


def test_all_lists_every_workspace(tmp_path, small_corpus, shared_ws):
    other = make_workspace(tmp_path / "other", small_corpus, tag="u")
    roots = data.discover()
    assert shared_ws.root in roots and other.root in roots
    app = appmod.create_app(data.sources([shared_ws.root, other.root]), auth.Guard("127.0.0.1", 8377), who="ana")
    with client(app) as cl:
        page = cl.get("/").text
        assert 'href="/w/0/"' in page and 'href="/w/1/"' in page and "no campaign" not in page
        assert 'data-live="/fragments"' in page and "data-index" not in page     # refreshes on any change
        assert cl.get("/w/1/").status_code == 200
        listed = cl.get("/fragments").json()["parts"]["workspaces"]
        assert str(shared_ws.root) in listed and str(other.root) in listed and "waiting" in listed
    with pytest.raises(data.DashboardError, match="cannot show"):
        data.sources([tmp_path / "nowhere"])


# --------------------------------------------------------------------------- a real server and a real browser

def test_train_py_sandbox_cannot_reach_the_dashboard(shared_ws, tmp_path):
    """train.py runs in bubblewrap without the host's network: the loopback dashboard is out of its reach."""
    import subprocess
    import sys

    from mcp_server.loop import sandbox

    if not sandbox.detect().available:
        pytest.skip("no OS sandbox here (bubblewrap); .ci/run installs it")
    port = free_port()
    app, _ = make_app(shared_ws, port=port)
    probe = tmp_path / "probe.py"
    probe.write_text("import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3)\n"
                     "    print('reached')\nexcept OSError as e:\n    print('refused', type(e).__name__)\n")
    with serving(app, port):
        socket.create_connection(("127.0.0.1", port), 3).close()      # reachable from the host
        cmd = sandbox.build_command([sys.executable, str(probe), str(port)], workspace=shared_ws.root,
                                    hide=[shared_ws.state_dir], scratch=tmp_path / "scratch", ro_binds=[probe],
                                    cwd=shared_ws.root)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.stdout.startswith("refused"), (r.stdout, r.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app, port: int):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


@contextlib.contextmanager
def hostile_site(target: str):
    """Another origin whose page auto-submits an Approve to the dashboard (a CSRF attempt)."""
    page = (f"<html><body><form id=f method=post action=\"{target}/w/0/approvals/1\">"
            "<input name=decision value=approve><input name=token value=guess></form>"
            "<script>document.getElementById('f').submit()</script></body></html>").encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/"   # same site, another origin
    finally:
        srv.shutdown()


@pytest.fixture()
def browser():
    if not (CHROMEDRIVER and CHROMIUM):
        pytest.skip("chromium and chromedriver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000",
              "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def wait_for(fn, timeout: float = 30.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def shot(drv, name: str) -> None:
    """dashboard-<name>.png (docs/ with LOOPWRIGHT_DOC_SHOTS=1): the whole page, beyond the window (Chrome
    DevTools' screenshot)."""
    SHOTS.mkdir(exist_ok=True)
    size = drv.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    png = drv.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 2600), "scale": 1}})
    (SHOTS / f"dashboard-{name}.png").write_bytes(base64.b64decode(png["data"]))


def test_in_a_browser_token_csrf_hostile_text_and_approve(ws, browser):
    from selenium.webdriver.common.by import By

    port = free_port()
    app, guard = make_app(ws, port=port)
    with serving(app, port) as base, hostile_site(base) as evil:
        browser.get(base + "/")
        wait_for(lambda: browser.find_elements(By.ID, "progress"), what="the chart")
        assert browser.title.startswith("t ") and browser.title != "pwned"
        # the hostile description is text: no element came from it and its script never ran
        table = browser.find_element(By.ID, "exp-table").text
        assert '<img src=x onerror="document.title=' in table and "<script>" in table
        assert not browser.find_elements(By.CSS_SELECTOR, "main img") and browser.title != "pwned"
        assert len(browser.find_elements(By.CSS_SELECTOR, "#progress circle")) == 3
        wait_for(lambda: "live" in browser.find_element(By.ID, "live").text, what="the SSE stream")
        # this browser has no token yet: the page says so, and Approve is refused by the server
        assert browser.find_element(By.CSS_SELECTOR, ".no-token").is_displayed()
        browser.find_element(By.CSS_SELECTOR, "form.decide button.approve").click()
        wait_for(lambda: "no dashboard token" in browser.page_source, what="the refusal")
        assert approval(ws)["status"] == "pending"
        browser.get(base + "/w/0/")
        wait_for(lambda: browser.find_elements(By.ID, "progress"), what="the chart")
        # hovering a point shows its experiment, description and verdict (as text)
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.support.ui import Select

        [hostile] = [c for c in browser.find_elements(By.CSS_SELECTOR, "#progress circle")
                     if "discard" in c.get_attribute("data-label")]
        ActionChains(browser).move_to_element(hostile).perform()
        tip = wait_for(lambda: [t for t in browser.find_elements(By.ID, "tip") if t.is_displayed()], what="the tip")[0]
        assert tip.text.startswith("#3 discard: <img src=x") and "val_bpb 2.0400" in tip.text
        # filters hide what does not match: by verdict, and by text
        Select(browser.find_element(By.ID, "f-verdict")).select_by_value("crash")
        shown = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#exp-table tbody tr") if r.is_displayed()]
        assert len(shown) == 1 and "a crash" in shown[0]
        Select(browser.find_element(By.ID, "f-verdict")).select_by_value("")
        browser.find_element(By.ID, "f-text").send_keys("learning rate")
        visible = [r for r in browser.find_elements(By.CSS_SELECTOR, "#exp-table tbody tr") if r.is_displayed()]
        assert len(visible) == 1 and "raise the learning rate" in visible[0].text
        # the person opens the printed URL: the page keeps the token for this origin and drops it from the URL
        browser.get(views_url(base, guard.token))
        wait_for(lambda: browser.current_url == base + "/w/0/", what="the token out of the address bar")
        assert browser.execute_script("return localStorage.getItem('loopwright-dashboard-token')") == guard.token
        assert not browser.find_element(By.CSS_SELECTOR, ".no-token").is_displayed()
        assert not browser.get_cookies()
        shot(browser, "overview")
        # a cross-site page auto-submitting Approve is refused (Origin; and it cannot know the CSRF field)
        browser.get(evil)
        wait_for(lambda: "refused" in browser.page_source, what="the cross-site refusal")
        assert "cross-site" in browser.page_source and approval(ws)["status"] == "pending"
        # Approve, for real
        browser.get(base + "/w/0/")
        browser.find_element(By.CSS_SELECTOR, "form.decide input[name=note]").send_keys("ship it")
        browser.find_element(By.CSS_SELECTOR, "form.decide button.approve").click()
        wait_for(lambda: "approved by ana" in browser.page_source, what="the decision page")
        app.state.appliers.join(60)
        a = approval(ws)
        assert (a["status"], a["decided_via"], a["decision_note"]) == ("applied", "dashboard", "ship it")
        browser.get(base + f"/w/0/experiments/{a['experiment_id']}")
        wait_for(lambda: browser.find_elements(By.ID, "diff"), what="the experiment page")
        assert "+LR = 0.005" in browser.find_element(By.ID, "diff").text
        assert "approved by ana via dashboard" in browser.find_element(By.ID, "summary").text


def views_url(base: str, token: str) -> str:
    from mcp_server.dashboard.views import link_with_token

    return link_with_token(base, token)


@pytest.mark.slow
def test_in_a_browser_the_chart_updates_when_a_real_run_finishes(tmp_path, small_corpus, browser):
    """One real tiny run, while the browser shows the page and a second client holds an SSE stream open and
    never reads it: the run is not slowed or blocked, and the chart gains its point."""
    from selenium.webdriver.common.by import By

    bench = hobbled_bench(tmp_path / "bench", max_steps=4, tiny=True)
    ws = make_workspace(tmp_path / "ws", small_corpus, bench_dir=bench, noise={"baseline_seeds": 1})
    with Engine(ws.root) as eng:
        record_baseline(eng, values=(2.0,))
    port = free_port()
    app, _ = make_app(ws, port=port)
    with serving(app, port) as base:
        browser.get(base + "/w/0/")
        wait_for(lambda: "live" in browser.find_element(By.ID, "live").text, what="the SSE stream")
        assert not browser.find_elements(By.CSS_SELECTOR, "#progress circle")
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        try:
            (ws.root / "train.py").write_text((ws.root / "train.py").read_text().replace("LR = 0.0002", "LR = 0.003"))
            started = time.time()
            with Engine(ws.root) as eng:
                res = eng.run_experiment("normal learning rate")
                eng.score(res.experiment_id)
            took = time.time() - started
            assert res.status == "ok", res
            circles = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#progress circle"), timeout=30,
                               what="the chart's new point")
            assert len(circles) == 1 and "normal learning rate" in circles[0].get_attribute("data-label")
            # the page still answers other clients while the stalled one holds its stream
            r = TestClient(app, base_url=f"http://127.0.0.1:{port}").get("/w/0/fragments")
            assert r.status_code == 200
        finally:
            stalled.close()
        assert took < 120, f"a 4-step tiny run took {took:.0f} s with a stalled SSE client"
        shot(browser, "live-chart")
        # the real run's page: its seed, the baseline run it is paired with, the difference, diff and log
        browser.get(base + f"/w/0/experiments/{res.experiment_id}")
        runs = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr"), what="the paired runs")
        with Engine(ws.root, read_only=True) as eng:
            row = eng.ledger.experiment(res.experiment_id)
        assert len(runs) == 1 and f"#{row['paired_with']}" in runs[0].text and str(row["seed"]) in runs[0].text
        assert "+LR = 0.003" in browser.find_element(By.ID, "diff").text
        assert browser.find_element(By.ID, "log").text.strip() != "Log tail\n(no log)"
        shot(browser, "experiment")
