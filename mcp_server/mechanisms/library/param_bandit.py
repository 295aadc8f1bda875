"""UCB1 over individual constants (not categories): the under-explored parameter first.

Reward of a change: 1 for a keep, 0 otherwise; a constant never changed has an infinite bound.
"""
import math


def advise(history, source):
    consts = history["constants"]
    if not consts:
        return {}
    pulls = {c["name"]: 0 for c in consts}
    wins = {c["name"]: 0 for c in consts}
    for t in history["trials"]:
        for name in t["changed"]:
            if name in pulls:
                pulls[name] += 1
                wins[name] += t["verdict"] == "keep"
    n = max(1, sum(pulls.values()))

    def ucb(name):
        if pulls[name] == 0:
            return math.inf
        return wins[name] / pulls[name] + 0.5 * math.sqrt(2 * math.log(n) / pulls[name])

    order = sorted(pulls, key=lambda k: (-ucb(k), pulls[k], k))
    best = order[0]
    cat = next(c["category"] for c in consts if c["name"] == best)
    why = "never changed" if pulls[best] == 0 else f"{wins[best]}/{pulls[best]} kept"
    return {"category": cat, "parameters": order[:3], "note": f"param_bandit: {best} ({why})"}
