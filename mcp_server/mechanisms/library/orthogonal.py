"""Forced orthogonal exploration: after 3 experiments without a keep, the category changed least
often over the whole campaign (not merely least recently), forced over plateau and bandit."""


def advise(history, source):
    if history["experiments_since_keep"] < 3:
        return {}
    consts = history["constants"]
    cats = sorted({c["category"] for c in consts})
    if not cats:
        return {}
    count = {c: 0 for c in cats}
    touched = {}
    for t in history["trials"]:
        if t["category"] in count:
            count[t["category"]] += 1
        for name in t["changed"]:
            touched[name] = touched.get(name, 0) + 1
    cat = min(cats, key=lambda c: (count[c], c))
    params = sorted((c["name"] for c in consts if c["category"] == cat), key=lambda n: (touched.get(n, 0), n))
    return {"category": cat, "parameters": params, "force": True,
            "note": f"orthogonal: {history['experiments_since_keep']} without a keep; {cat} tried {count[cat]} times"}
