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
REPO = Path(__file__).resolve().parent.parent


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
