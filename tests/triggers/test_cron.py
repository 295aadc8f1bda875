"""The cron scheduler: fire times, coalescing, grace, no overlap, DST, persistence, SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from mcp_server.loop.config import ScheduleConfig
from mcp_server.triggers.common import SessionLock
from mcp_server.triggers.cron import Scheduler, install_lines, next_fire

UTC = timezone.utc
REPO = Path(__file__).resolve().parents[2]


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


class Recorder:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def __call__(self, schedule, detail: str) -> None:
        self.calls.append((schedule.cron, detail))
        if self.fail:
            raise RuntimeError("agent binary not found")


def make(tmp_path, *schedules, start=None) -> Scheduler:
    return Scheduler(list(schedules), tmp_path / "cron.json", tmp_path / "session.lock", start or Recorder())


def minutes(start: datetime, end: datetime, step: int = 1):
    t = start
    while t <= end:
        yield t
        t += timedelta(minutes=step)


def test_next_fire_in_the_schedules_timezone():
    s = ScheduleConfig(cron="0 1 * * *")
    assert next_fire(s, at(2026, 1, 1, 0, 30)) == at(2026, 1, 1, 1, 0)
    assert next_fire(s, at(2026, 1, 1, 1, 0)) == at(2026, 1, 2, 1, 0)     # strictly after
    berlin = ScheduleConfig(cron="0 1 * * *", timezone="Europe/Berlin")
    assert next_fire(berlin, at(2026, 1, 1, 0, 30)) == at(2026, 1, 2, 0, 0)   # 01:00 CET = 00:00 UTC
    assert next_fire(berlin, at(2026, 7, 1, 0, 30)) == at(2026, 7, 1, 23, 0)  # 01:00 CEST = 23:00 UTC
    weekly = ScheduleConfig(cron="0 9 * * 0")                                  # cron weekday 0 = Sunday
    assert next_fire(weekly, at(2026, 3, 2)).strftime("%A") == "Sunday"


def test_invalid_expressions_are_rejected(tmp_path):
    for bad in ("61 * * * *", "* * *", "every day", "0 25 * * *"):
        with pytest.raises(ValidationError):
            ScheduleConfig(cron=bad)
    # croniter reads a 6th field as seconds: the config refuses it, and so does the scheduler
    # for a schedule built without validation
    with pytest.raises(ValidationError, match="5-field"):
        ScheduleConfig(cron="0 1 * * * *")
    with pytest.raises(ValueError, match="5 cron fields"):
        make(tmp_path, ScheduleConfig.model_construct(cron="0 1 * * * *", agent="claude", timezone="UTC",
                                                      max_session_minutes=120, grace_minutes=60))


def test_first_tick_initializes_then_fires_once_per_fire_time(tmp_path):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="0 1 * * *"), start=rec)
    assert [r.outcome for r in sched.run_once(at(2026, 1, 1, 0, 0))] == ["initialized"]
    assert sched.run_once(at(2026, 1, 1, 0, 59)) == []
    [r] = sched.run_once(at(2026, 1, 1, 1, 0, 20))
    assert r.outcome == "started" and r.fire == at(2026, 1, 1, 1, 0)
    assert sched.run_once(at(2026, 1, 1, 1, 1)) == []
    # a restarted scheduler (or `cron --once` from system cron) reads the persisted last fire
    again = make(tmp_path, ScheduleConfig(cron="0 1 * * *"), start=rec)
    assert again.run_once(at(2026, 1, 1, 1, 2)) == []
    assert len(rec.calls) == 1 and "fire 2026-01-01T01:00:00+00:00" in rec.calls[0][1]
    state = json.loads((tmp_path / "cron.json").read_text())
    assert list(state.values())[0]["last_fire"] == "2026-01-01T01:00:00+00:00"


def test_missed_fires_are_coalesced_into_the_newest(tmp_path):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="*/10 * * * *", grace_minutes=60), start=rec)
    sched.run_once(at(2026, 1, 1, 0, 0))
    # the daemon was down from 00:00 to 00:35: fires at 00:10, 00:20 and 00:30 were missed
    [r] = sched.run_once(at(2026, 1, 1, 0, 35))
    assert r.outcome == "started" and r.fire == at(2026, 1, 1, 0, 30)
    assert len(rec.calls) == 1
    assert sched.run_once(at(2026, 1, 1, 0, 39)) == []
    assert sched.run_once(at(2026, 1, 1, 0, 40))[0].fire == at(2026, 1, 1, 0, 40)


def test_a_fire_older_than_grace_is_skipped(tmp_path):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="0 1 * * *", grace_minutes=60), start=rec)
    sched.run_once(at(2026, 1, 1, 0, 0))
    [r] = sched.run_once(at(2026, 1, 1, 3, 0))           # woke up two hours late
    assert r.outcome == "skipped-grace" and r.fire == at(2026, 1, 1, 1, 0)
    assert rec.calls == []
    assert sched.run_once(at(2026, 1, 1, 3, 1)) == []     # not reported again
    assert sched.run_once(at(2026, 1, 2, 1, 59))[0].outcome == "started"   # next day, within grace


def test_no_overlap_while_another_fd_holds_the_lock(tmp_path):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="*/5 * * * *", grace_minutes=30), start=rec)
    sched.run_once(at(2026, 1, 1, 0, 0))
    held = SessionLock(tmp_path / "session.lock").try_acquire()
    assert held is not None
    assert sched.run_once(at(2026, 1, 1, 0, 5))[0].outcome == "skipped-locked"
    assert sched.run_once(at(2026, 1, 1, 0, 6))[0].outcome == "skipped-locked"
    held.release()
    [r] = sched.run_once(at(2026, 1, 1, 0, 7))            # the session ended within grace: run it now
    assert r.outcome == "started" and r.fire == at(2026, 1, 1, 0, 5)
    assert len(rec.calls) == 1


def test_no_overlap_while_another_process_holds_the_lock(tmp_path):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="*/5 * * * *"), start=rec)
    sched.run_once(at(2026, 1, 1, 0, 0))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(tmp_path / 'session.lock')!r}, 'a')
        fcntl.flock(f, fcntl.LOCK_EX)
        print('locked', flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert sched.run_once(at(2026, 1, 1, 0, 5))[0].outcome == "skipped-locked"
        assert rec.calls == []
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert sched.run_once(at(2026, 1, 1, 0, 6))[0].outcome == "started"


def test_the_lock_is_held_while_the_session_runs(tmp_path):
    seen = []

    def start(schedule, detail):
        seen.append(SessionLock(tmp_path / "session.lock").try_acquire())

    sched = make(tmp_path, ScheduleConfig(cron="*/5 * * * *"), start=start)
    sched.run_once(at(2026, 1, 1, 0, 0))
    sched.run_once(at(2026, 1, 1, 0, 5))
    assert seen == [None]
    assert SessionLock(tmp_path / "session.lock").try_acquire() is not None   # released afterwards


def test_a_failing_session_is_recorded_and_not_retried(tmp_path):
    rec = Recorder(fail=True)
    sched = make(tmp_path, ScheduleConfig(cron="*/5 * * * *"), start=rec)
    sched.run_once(at(2026, 1, 1, 0, 0))
    [r] = sched.run_once(at(2026, 1, 1, 0, 5))
    assert r.outcome == "failed" and "agent binary not found" in r.detail
    assert sched.run_once(at(2026, 1, 1, 0, 6)) == []
    assert len(rec.calls) == 1


def test_dst_spring_forward_fires_once_after_the_jump():
    s = ScheduleConfig(cron="30 2 * * *", timezone="Europe/Berlin")
    fires, t = [], at(2026, 3, 27, 12, 0)
    for _ in range(3):
        t = next_fire(s, t)
        fires.append(t)
    # 02:30 does not exist on 29 March: it fires at 03:00 CEST (01:00 UTC), once
    assert fires == [at(2026, 3, 28, 1, 30), at(2026, 3, 29, 1, 0), at(2026, 3, 30, 0, 30)]


def test_dst_fall_back_fires_a_fixed_hour_once_but_an_hourly_job_twice():
    s = ScheduleConfig(cron="30 2 * * *", timezone="Europe/Berlin")
    fires, t = [], at(2026, 10, 23, 12, 0)
    for _ in range(3):
        t = next_fire(s, t)
        fires.append(t)
    # 02:30 happens twice on 25 October (CEST, then CET): a daily job runs once
    assert fires == [at(2026, 10, 24, 0, 30), at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30)]
    hourly = ScheduleConfig(cron="30 * * * *", timezone="Europe/Berlin")
    assert next_fire(hourly, at(2026, 10, 25, 0, 30)) == at(2026, 10, 25, 1, 30)   # two real hours


@pytest.mark.parametrize("day", [(2026, 3, 28), (2026, 10, 24)])
def test_dst_days_ticking_every_minute_start_one_session_per_day(tmp_path, day):
    rec = Recorder()
    sched = make(tmp_path, ScheduleConfig(cron="30 2 * * *", timezone="Europe/Berlin"), start=rec)
    start = at(*day, 20, 0)
    for now in minutes(start, start + timedelta(hours=32), step=5):   # through the DST night and the next
        sched.run_once(now)
    assert len(rec.calls) == 2, rec.calls    # the DST night and the night after


def test_install_lines():
    out = install_lines("/srv/ws", "/opt/venv/bin/python", env={})
    assert out["crontab"].startswith("* * * * * cd /srv/ws && /opt/venv/bin/python -m mcp_server.cli cron --once")
    assert "ExecStart=/opt/venv/bin/python -m mcp_server.cli cron --once" in out["service"]
    assert "WorkingDirectory=/srv/ws" in out["service"]
    assert "OnCalendar=*-*-* *:*:00" in out["timer"] and "[Install]" in out["timer"]


def test_sigterm_stops_the_daemon_cleanly(tmp_path):
    from mcp_server.loop import settings as setmod
    from mcp_server.loop.setup import _write_id, create_state_dir

    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "loopwright.toml").write_text("")
    wid, st = create_state_dir(ws)           # schedules are settings, in the state directory
    _write_id(ws, wid)
    sched = setmod.set_value(setmod.set_value(setmod.Settings(), "schedule.0.cron", "0 1 * * *"),
                             "schedule.0.agent", "builtin")
    setmod.save(st / setmod.SETTINGS_NAME, sched)
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys; from mcp_server.triggers.cron import serve_forever; "
                             "sys.exit(serve_forever(sys.argv[1]))", str(ws)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = st / "cron.json"
    deadline = time.monotonic() + 30
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.exists(), proc.communicate(timeout=5)[0] if proc.poll() is not None else "no first tick"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    assert time.monotonic() - t0 < 5                       # did not wait out the poll interval
    assert list(json.loads(state.read_text()).values())[0]["outcome"] == "initialized"


# -- the installed entry, run as cron runs it ---------------------------------------------------------

TOKEN = "xoxb-cron-test-token"


def _cron_ws(tmp_path, small_corpus, slack_url):
    from mcp_server.loop import settings as setmod
    from mcp_server.triggers.cron import STATE_NAME

    from conftest import make_workspace

    ws = make_workspace(tmp_path / "ws", small_corpus)
    s = setmod.load(ws.settings_path)
    for key, value in (("schedule.0.cron", "* * * * *"), ("schedule.0.agent", "claude"),
                       ("schedule.0.max_session_minutes", "3"), ("slack.channel", "C0RESEARCH"),
                       ("slack.base_url", slack_url)):
        s = setmod.set_value(s, key, value)
    setmod.save(ws.settings_path, s)
    # the scheduler has seen this schedule before: the newest minute is due on the next tick
    (ws.state_dir / STATE_NAME).write_text(json.dumps({"* * * * *|UTC|claude": {
        "last_fire": datetime.fromtimestamp(time.time() - 300, UTC).isoformat(), "outcome": "started"}}))
    return ws


def _stand_in_claude(tmp_path) -> Path:
    bin_dir = tmp_path / "client-bin"
    bin_dir.mkdir()
    exe = bin_dir / "claude"
    exe.write_text(f"#!{sys.executable}\nimport json, os\n"
                   f"json.dump(dict(os.environ), open({str(tmp_path / 'client-env.json')!r}, 'w'))\n"
                   "print(json.dumps({'type': 'result', 'subtype': 'success', 'num_turns': 1, 'total_cost_usd': 0}))\n")
    exe.chmod(0o755)
    return bin_dir


def _install(ws, tmp_path, path: str) -> tuple[str, str]:
    """`loopwright cron --install` from a user's shell (with the token exported there), into a crontab file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_CLAUDE")}
    env.update(PATH=path, LOOPWRIGHT_CRONTAB=str(tmp_path / "crontab"), SLACK_BOT_TOKEN=TOKEN,
               PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "mcp_server.cli", "cron", "--install", "-w", str(ws.root)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "crontab").read_text()
    assert TOKEN not in text                                   # secrets are never written
    from mcp_server.triggers import crontab

    line = crontab.entry(text, ws.root)
    assert line is not None, text
    return text, line


def _as_cron(tmp_path, crontab_text: str, line: str) -> subprocess.CompletedProcess:
    """What cron does with the entry: /bin/sh -c COMMAND with only cron's environment (env -i)."""
    from mcp_server.triggers import crontab

    (tmp_path / "crontab").write_text(crontab_text)
    env = crontab.cron_environment(crontab_text)
    assert set(env) <= {"HOME", "LOGNAME", "SHELL", "PATH", "SLACK_BOT_TOKEN"}
    return subprocess.run(["/bin/sh", "-c", crontab.command_of(line)], env=env, capture_output=True, text=True,
                          timeout=300)


def _cli(ws, *args, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args, "-w", str(ws.root)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_installed_entry_runs_the_client_under_cron_and_reaches_slack(tmp_path, small_corpus):
    from fakes.fake_slack import FakeSlack

    bin_dir = _stand_in_claude(tmp_path)
    with FakeSlack(TOKEN) as slack:
        ws = _cron_ws(tmp_path, small_corpus, slack.api_url)
        text, line = _install(ws, tmp_path, f"{bin_dir}:{os.environ['PATH']}")
        assert f"PATH={bin_dir}:" in line and "LOOPWRIGHT_HOME=" in line
        # the person gives the job its token in the crontab's environment; loopwright wrote none
        text = f"SLACK_BOT_TOKEN={TOKEN}\n" + text
        r = _as_cron(tmp_path, text, line)
        assert r.returncode == 0, r.stdout + r.stderr
        log = (ws.root / ".loopwright" / "cron.log").read_text()
        assert "started" in log and "Traceback" not in log, log
        with ws.ledger() as led:
            (s,) = led.sessions()
        assert (s["agent"], s["trigger"], s["exit_code"]) == ("claude", "cron", 0)
        assert any("Session ended (claude, cron)" in m.get("text", "") for m in slack.messages), slack.messages
        assert "SLACK_BOT_TOKEN" not in json.loads((tmp_path / "client-env.json").read_text())
        doctor = _cli(ws, "doctor", "--as-cron", env_extra={"LOOPWRIGHT_CRONTAB": str(tmp_path / "crontab")})
        assert doctor.returncode == 0 and "works under cron's environment" in doctor.stdout, doctor.stdout


def test_an_entry_whose_client_is_missing_fails_loudly(tmp_path, small_corpus):
    from fakes.fake_slack import FakeSlack

    with FakeSlack(TOKEN) as slack:
        ws = _cron_ws(tmp_path, small_corpus, slack.api_url)
        text, line = _install(ws, tmp_path, "/usr/local/bin:/usr/bin:/bin")     # a PATH without claude
        text = f"SLACK_BOT_TOKEN={TOKEN}\n" + text
        crontab_env = {"LOOPWRIGHT_CRONTAB": str(tmp_path / "crontab")}
        (tmp_path / "crontab").write_text(text)
        doctor = _cli(ws, "doctor", "--as-cron", env_extra=crontab_env)
        assert doctor.returncode == 1 and "`claude` is not on PATH" in doctor.stdout, doctor.stdout
        r = _as_cron(tmp_path, text, line)
        assert r.returncode != 0
        log = (ws.root / ".loopwright" / "cron.log").read_text()
        assert "`claude` is not on PATH" in log and "Traceback" not in log, log
        status = _cli(ws, "status")
        assert "cron session FAILED TO START" in status.stdout and "not on PATH" in status.stdout, status.stdout
        assert any("Session could not start (claude, cron)" in m.get("text", "") for m in slack.messages)


def test_a_cron_run_without_a_configured_connectors_token_fails_loudly(tmp_path, small_corpus):
    bin_dir = _stand_in_claude(tmp_path)
    ws = _cron_ws(tmp_path, small_corpus, "http://127.0.0.1:9/api/")
    text, line = _install(ws, tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    r = _as_cron(tmp_path, text, line)                          # no token in cron's environment
    assert r.returncode != 0
    assert not (tmp_path / "client-env.json").exists()          # no session ran without its connector
    status = _cli(ws, "status")
    assert "FAILED TO START" in status.stdout and "SLACK_BOT_TOKEN" in status.stdout, status.stdout
    with ws.ledger() as led:
        (ev,) = led.events(kind="launch_failed")
        assert [d["status"] for d in led.deliveries() if d["event_id"] == ev["id"]] == ["pending"]
