"""Server-rendered HTML. Every value that reaches a page goes through `h()` (html.escape, quotes too):
descriptions, hypotheses, reasons, diffs and logs are written by the agent or its code and must stay inert.
The Content-Security-Policy set in app.py backs this up (no inline script, no foreign origin)."""
from __future__ import annotations

import html
import time
from typing import Any, Optional
from urllib.parse import quote

VERDICT_CLASS = {"keep": "keep", "discard": "discard", "retest": "retest", "pending_approval": "pending",
                 "baseline": "baseline"}
FAILED = ("crash", "timeout", "rejected", "lost", "interrupted")


def h(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num(v: Optional[float], digits: int = 4, sign: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def page(title: str, body: str, refresh_url: Optional[str] = None, version: Optional[tuple[int, str]] = None) -> str:
    live = f' data-live="{h(refresh_url)}"' if refresh_url else ""
    if version is not None:     # (workspace index, the ledger version this page shows): refresh only on a change
        live += f' data-index="{version[0]}" data-version="{h(version[1])}"'
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{h(title)} · loopwright</title><meta name=\"viewport\" content=\"width=device-width\">"
            "<link rel=\"stylesheet\" href=\"/static/dashboard.css\">"
            "<script src=\"/static/dashboard.js\" defer></script></head>"
            f"<body{live}><header><a href=\"/\" class=\"brand\">loopwright</a> <span class=\"title\">{h(title)}</span>"
            "<span id=\"live\" class=\"live\" title=\"live updates\"></span></header>"
            f"<main>{body}</main></body></html>")


def message_page(title: str, text: str, back: str) -> str:
    return page(title, f"<section class=\"card\"><p class=\"message\">{h(text)}</p>"
                       f"<p><a href=\"{h(back)}\">back to the dashboard</a></p></section>")


def index(snaps: list[dict]) -> str:
    return page("all workspaces", f"<section class=\"card\" id=\"workspaces\">{index_table(snaps)}</section>",
                refresh_url="/fragments")


def index_table(snaps: list[dict]) -> str:
    rows = "".join(
        f"<tr><td><a href=\"/w/{s['index']}/\">{h(s.get('tag') or '(no campaign)')}</a></td>"
        f"<td class=\"mono\">{h(s['root'])}</td><td><span class=\"state\">{h(s['state'])}</span></td>"
        f"<td>{num(s.get('overview', {}).get('best'))}</td><td>{num(s.get('overview', {}).get('baseline'))}</td>"
        f"<td>{h(s.get('overview', {}).get('experiments', 0))}</td>"
        f"<td>{len([a for a in s.get('approvals', []) if a['status'] == 'pending'])}</td></tr>"
        for s in snaps)
    return ("<h2>Workspaces</h2><table><thead><tr><th>campaign</th><th>workspace</th><th>state</th><th>best</th>"
            f"<th>baseline</th><th>experiments</th><th>waiting</th></tr></thead><tbody>{rows}</tbody></table>")


def workspace(snap: dict, fragments: dict[str, str], version: str) -> str:
    body = "".join(f"<section class=\"card\" id=\"{name}\">{html_}</section>" for name, html_ in fragments.items())
    return page(f"{snap.get('tag') or '(no campaign)'} — {snap['root']}", body,
                refresh_url=f"/w/{snap['index']}/fragments", version=(snap["index"], version))


def fragments(snap: dict, read_only: bool) -> dict[str, str]:
    """The parts of the workspace page the live updates replace, each rendered whole."""
    return {"overview": overview(snap), "chart": chart(snap), "approvals": approvals(snap, read_only),
            "experiments": experiments(snap)}


def overview(s: dict) -> str:
    o = s.get("overview") or {}
    if not o:
        return f"<h2>Campaign</h2><p>{h(s['state'])}: run `loopwright init` in {h(s['root'])}</p>"
    ex = o["executor"]
    where = ex["kind"] + (f" at {ex['address']}" if ex.get("address") else "") + f", parallel {ex['parallel']}"
    workers = ", ".join(f"{w['worker']} ({w['runs']} runs, {w['lost']} lost)" for w in o["workers"][:6]) or "–"

    def left(used, rest, unit="", digits=2):
        return f"{used:.{digits}f}{unit} used, " + ("no cap" if rest is None else f"{rest:.{digits}f}{unit} left")

    items = [("state", f"<span class=\"state state-{h(s['state'].replace(' ', '-'))}\">{h(s['state'])}</span>"),
             ("best val_bpb", f"{num(o['best'])} (#{h(o['best_experiment_id'] or 'baseline')}, {h(o['best_commit'])})"),
             ("baseline", num(o["baseline"])), ("gain vs baseline", num(o["gain"], sign=True)),
             ("experiments", f"{o['experiments']} ({o['kept']} kept, {o['discarded']} discarded, "
                             f"{o['crashed']} failed)"),
             ("runs", left(o["runs_used"], o["runs_left"], digits=0)), ("hours", left(o["hours_used"], o["hours_left"])),
             ("cost", left(o["cost_used"], o["cost_left"], " $")),
             ("MDE", f"{num(o['mde'])} (keep bar {num(o['keep_threshold'])})"),
             ("executor", h(where)), ("in flight", h(len(o["in_flight"]))), ("workers", h(workers)),
             ("mechanism", h(o["mechanism"] or "default")), ("autonomy", h(o["autonomy"]))]
    dl = "".join(f"<div><dt>{h(k)}</dt><dd>{v}</dd></div>" for k, v in items)
    why = "".join(f"<li>{h(r)}</li>" for r in o["reasons"])
    return (f"<h2>Campaign {h(s['tag'])} <small class=\"mono\">{h(s['branch'])}</small></h2><dl class=\"grid\">{dl}</dl>"
            + (f"<ul class=\"reasons\">{why}</ul>" if why else ""))


# -- the chart: the progress.png data as SVG, one link per experiment, hover shows what it was ----------------
W, H, PAD = 860, 300, 44


def chart(s: dict) -> str:
    pts = [p for p in s.get("points", []) if p["val_bpb"] is not None or p["status"] in FAILED]
    base = (s.get("overview") or {}).get("baseline")
    vals = [p["val_bpb"] for p in pts if p["val_bpb"] is not None] + ([base] if base is not None else [])
    head = f"<h2>Progress <small>{len(pts)} experiments</small></h2>"
    if not vals:
        return head + "<p class=\"empty\">No measured experiment yet.</p>"
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 0.01
    lo, hi = lo - 0.08 * span, hi + 0.12 * span
    n = max(len(s.get("points", [])), 1)

    def x(k: int) -> float:
        return PAD + (W - 2 * PAD) * (k - 0.5) / n

    def y(v: float) -> float:
        return PAD / 2 + (H - PAD) * (hi - v) / (hi - lo)

    parts = [f"<svg id=\"progress\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"val_bpb per experiment\">",
             f"<text x=\"6\" y=\"{PAD / 2 - 6}\" class=\"axis\">val_bpb (lower is better)</text>"]
    for t in range(5):
        v = lo + (hi - lo) * t / 4
        parts.append(f"<line x1=\"{PAD}\" x2=\"{W - PAD / 2}\" y1=\"{y(v):.1f}\" y2=\"{y(v):.1f}\" class=\"grid\"/>"
                     f"<text x=\"2\" y=\"{y(v) + 4:.1f}\" class=\"axis\">{v:.3f}</text>")
    if base is not None:
        parts.append(f"<line x1=\"{PAD}\" x2=\"{W - PAD / 2}\" y1=\"{y(base):.1f}\" y2=\"{y(base):.1f}\" "
                     "class=\"baseline\"><title>baseline</title></line>")
    best, step = base, []
    for p in s.get("points", []):
        if p["verdict"] == "keep" and p["val_bpb"] is not None:
            best = p["val_bpb"]
        if best is not None:
            step.append(f"{x(p['n']) - (W - 2 * PAD) / n / 2:.1f},{y(best):.1f} {x(p['n']) + (W - 2 * PAD) / n / 2:.1f},"
                        f"{y(best):.1f}")
    if step:
        parts.append(f"<polyline points=\"{' '.join(step)}\" class=\"best\"/>")
    for p in pts:
        failed = p["val_bpb"] is None
        cls = "crash" if failed else VERDICT_CLASS.get(p["verdict"] or "", "unscored")
        cy = y(hi - 0.02 * (hi - lo)) if failed else y(p["val_bpb"])
        label = (f"#{p['id']} {p['verdict'] or p['status']}: {p['description']}"
                 f" — val_bpb {num(p['val_bpb'])}" + (f", paired gain {num(p['paired_gain'], sign=True)}"
                                                      if p["paired_gain"] is not None else ""))
        parts.append(f"<a href=\"experiments/{p['id']}\" class=\"pt\"><circle cx=\"{x(p['n']):.1f}\" cy=\"{cy:.1f}\" "
                     f"r=\"{6 if cls == 'keep' else 4.5}\" class=\"{cls}\" data-id=\"{p['id']}\" "
                     f"data-label=\"{h(label)}\"><title>{h(label)}</title></circle></a>")
    parts.append("</svg><div id=\"tip\" class=\"tip\" hidden></div>"
                 "<p class=\"legend\"><span class=\"keep\">●</span> kept <span class=\"discard\">●</span> discarded "
                 "<span class=\"pending\">●</span> waiting <span class=\"crash\">●</span> failed "
                 "<span class=\"bestline\">—</span> best so far</p>")
    return head + "".join(parts)


def approvals(s: dict, read_only: bool) -> str:
    rows = s.get("approvals", [])
    head = f"<h2>Waiting for a person <small>{len(rows)}</small></h2>"
    if not rows:
        return head + "<p class=\"empty\">Nothing waits.</p>"
    out = []
    for a in rows:
        what = (f"keep of <a href=\"experiments/{a['experiment_id']}\">#{a['experiment_id']}</a> "
                f"(val_bpb {num(a['val_bpb'])}, {num(a['delta_vs_best'], sign=True)} vs best)"
                if a["kind"] == "keep" else "a run before it starts")
        expires = (f"auto-reject in {max(0.0, (a['expires_at'] - time.time()) / 3600):.1f} h"
                   if a["status"] == "pending" and a["expires_at"] else "")
        if a["status"] != "pending":
            act = f"<span class=\"decided\">{h(a['status'])} by {h(a['decided_by'])}; applied when the loop is idle</span>"
        elif read_only:
            act = "<span class=\"note\">read-only dashboard: decide with <code>loopwright approve</code></span>"
        else:   # the page's script fills in the token (kept by this browser for this origin only)
            url = f"approvals/{a['id']}"
            act = (f"<form method=\"post\" action=\"{url}\" class=\"decide\">"
                   "<input type=\"hidden\" name=\"token\" value=\"\">"
                   "<input type=\"text\" name=\"note\" placeholder=\"note (a reject needs a reason)\" maxlength=\"500\">"
                   "<button name=\"decision\" value=\"approve\" class=\"approve\">Approve</button>"
                   "<button name=\"decision\" value=\"reject\" class=\"reject\">Reject</button></form>")
        out.append(f"<li id=\"approval-{a['id']}\"><div><b>#{a['id']}</b> {h(a['status'])}: {what}: "
                   f"<span class=\"desc\">{h(a['description'])}</span> <span class=\"mono\">{h(a['branch'])} "
                   f"{h((a['commit'] or '')[:10])}</span> <small>{h(expires)}</small></div>{act}</li>")
    hint = ("" if read_only else "<p class=\"note no-token\" hidden>This browser has no dashboard token: open the "
            "URL <code>loopwright dashboard</code> printed at start to decide here.</p>")
    return head + hint + f"<ul class=\"approvals\">{''.join(out)}</ul>"


TABLE_ROWS = 1000    # the newest; the chart shows every experiment


def experiments(s: dict) -> str:
    every = s.get("points", [])
    pts = list(reversed(every))[:TABLE_ROWS]
    more = (f"<p class=\"note\">The newest {TABLE_ROWS} of {len(every)} experiments (the filters search these); "
            "`loopwright export-tsv` has them all.</p>" if len(every) > TABLE_ROWS else "")
    verdicts = sorted({p["verdict"] or p["status"] for p in pts})
    opts = "".join(f"<option value=\"{h(v)}\">{h(v)}</option>" for v in verdicts)
    rows = "".join(
        f"<tr data-verdict=\"{h(p['verdict'] or p['status'])}\"><td><a href=\"experiments/{p['id']}\">#{p['id']}</a></td>"
        f"<td class=\"{VERDICT_CLASS.get(p['verdict'] or '', 'crash' if p['status'] in FAILED else '')}\">"
        f"{h(p['verdict'] or p['status'])}</td><td>{num(p['val_bpb'])}</td><td>{num(p['paired_gain'], sign=True)}</td>"
        f"<td>{h(p['samples'])}</td><td class=\"desc\">{h(p['description'])}</td>"
        f"<td class=\"reason\">{h(p['reason'][:200])}</td></tr>" for p in pts)
    return ("<h2>Experiments</h2><div class=\"filters\"><label>verdict <select id=\"f-verdict\"><option value=\"\">all"
            f"</option>{opts}</select></label> <label>search <input id=\"f-text\" type=\"search\" "
            "placeholder=\"description, reason\"></label></div><table id=\"exp-table\"><thead><tr><th>#</th>"
            "<th>verdict</th><th>val_bpb</th><th>paired gain</th><th>runs</th><th>description</th><th>reason</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>{more}")


def experiment(index_: int, d: dict) -> str:
    runs = "".join(
        f"<tr><td>#{r['id']}</td><td>{h(r['role'] or '')}</td><td>{h(r['seed'])}</td><td>{h(r['status'])}</td>"
        f"<td>{num(r['val_bpb'])}</td><td>{'#' + h(r['reference_id']) if r['reference_id'] else '–'}</td>"
        f"<td>{num(r['reference_val_bpb'])}</td><td>{num(r['d'], sign=True)}</td><td>{h(r['num_steps'])}</td></tr>"
        for r in d["runs"])
    rep = d["replay"]
    replay = ("<p class=\"empty\">Not replayed (`loopwright replay`).</p>" if rep is None else
              f"<p>Replay #{h(rep['replay'])}: <b>{h(rep['outcome'])}</b>, mean paired gain {num(rep['gain'], sign=True)} "
              "on fresh seeds</p><table><thead><tr><th>seed</th><th>parent</th><th>child</th><th>d</th></tr></thead>"
              "<tbody>" + "".join(f"<tr><td>{h(p['seed'])}</td><td>{num(p['parent'])}</td><td>{num(p['child'])}</td>"
                                  f"<td>{num(p['d'], sign=True)}</td></tr>" for p in rep["pairs"]) + "</tbody></table>")
    body = (f"<p><a href=\"/w/{index_}/\">← campaign</a></p>"
            f"<section class=\"card\" id=\"summary\"><h2>Experiment #{d['id']}: <span class=\"desc\">"
            f"{h(d['description'])}</span></h2><dl class=\"grid\">"
            f"<div><dt>status</dt><dd>{h(d['status'])}</dd></div><div><dt>verdict</dt><dd>{h(d['verdict'])}</dd></div>"
            f"<div><dt>commit</dt><dd class=\"mono\">{h((d['commit'] or '')[:12])} (parent "
            f"{h((d['parent'] or '')[:12])})</dd></div></dl>"
            f"<p><b>Hypothesis:</b> <span class=\"hyp\">{h(d['hypothesis'] or '–')}</span></p>"
            f"<p><b>Verdict reason:</b> <span class=\"reason\">{h(d['verdict_reason'] or d['reason'] or '–')}</span></p>"
            "</section>"
            f"<section class=\"card\" id=\"runs\"><h2>Paired runs</h2><table><thead><tr><th>run</th><th>role</th>"
            "<th>seed</th><th>status</th><th>val_bpb</th><th>reference</th><th>ref val_bpb</th><th>d</th>"
            f"<th>steps</th></tr></thead><tbody>{runs}</tbody></table></section>"
            f"<section class=\"card\" id=\"replay\"><h2>Replay</h2>{replay}</section>"
            f"<section class=\"card\" id=\"diff\"><h2>Diff</h2><pre class=\"diff\">{diff_html(d['diff'])}</pre>"
            "</section>"
            f"<section class=\"card\" id=\"log\"><h2>Log tail</h2><pre>{h(d['log_tail'] or '(no log)')}</pre></section>")
    return page(f"experiment #{d['id']}", body)


def diff_html(diff: str) -> str:
    """Each line escaped, added and removed lines marked for colour."""
    if not diff:
        return "(no change)"
    cls = {"+": "add", "-": "del", "@": "hunk"}
    return "\n".join(f"<span class=\"{cls[line[0]]}\">{h(line)}</span>" if line[:1] in cls and line[:3] not in
                     ("+++", "---") else h(line) for line in diff.splitlines())


def link_with_token(base: str, token: str) -> str:
    """The URL printed at start: the token in the fragment, which the browser keeps and never sends."""
    return f"{base}/#token={quote(token)}"
