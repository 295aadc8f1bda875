"""Runs one mechanism's code inside the sandbox (started by mechanisms/validate.py as a script,
`python -I sandbox_child.py`, so nothing of loopwright is imported here: a mechanism sees only
the JSON it is given).

stdin: {"name": str, "code": str, "cases": [{"label": str, "history": {...}, "source": str}]}
stdout: one JSON line per stage, flushed at once, so that the parent knows how far it got when
the process is killed at its deadline:
    {"stage": "import", "ok": true} | {"stage": "import", "ok": false, "error": "..."}
    {"stage": "case", "label": ..., "ok": true, "advice": {...}} | {... "ok": false, "error": "..."}
"""
import json
import sys
import traceback
import types


def _say(obj):
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _short_error(e):
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"line {f.lineno}" for f in reversed(tb) if f.filename.startswith("<mechanism")), "")
    # short: an error message is no channel for what the code read
    return (f"{type(e).__name__}: {str(e)[:200]}" + (f" ({where})" if where else ""))[:300]


def main():
    req = json.loads(sys.stdin.read())
    mod = types.ModuleType(f"mechanism_{req['name']}")
    try:
        exec(compile(req["code"], f"<mechanism {req['name']}>", "exec"), mod.__dict__)
        fn = getattr(mod, "advise", None)
        if not callable(fn):
            raise TypeError("the module defines no function advise(history, source)")
    except BaseException as e:  # noqa: BLE001 - whatever it is, the parent reports it
        _say({"stage": "import", "ok": False, "error": _short_error(e)})
        return
    _say({"stage": "import", "ok": True})
    for case in req["cases"]:
        try:
            out = fn(case["history"], case["source"])
            json.dumps(out)   # must be plain data
            _say({"stage": "case", "label": case["label"], "ok": True, "advice": out})
        except BaseException as e:  # noqa: BLE001
            _say({"stage": "case", "label": case["label"], "ok": False, "error": _short_error(e)})


if __name__ == "__main__":
    main()
