#!/usr/bin/env python3
"""Compares two vramfuzz campaign outputs made with the same flags but different --policy: the
built-in predictor and the same predictor served over the external-predictor protocol. They must
agree on every count, every finding (signature, count, worst overshoot, first case, shrink
executions) and every shrunk repro's scenario and verdict; only the policy's name and the paths
that carry it may differ. Exit 0 when equal, 1 with the differences listed."""
import json
import os
import sys


def normalise(value, names):
    if isinstance(value, dict):
        return {k: normalise(v, names) for k, v in value.items() if k not in ("command", "tool", "run", "replay", "file", "repro", "found_by", "seconds")}
    if isinstance(value, list):
        return [normalise(v, names) for v in value]
    if isinstance(value, str):
        for old, new in names:
            value = value.replace(old, new)
        return value
    return value


def policy_of_repro(scenario_policy):
    return scenario_policy["name"] if isinstance(scenario_policy, dict) else scenario_policy


def load(out_dir):
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    repros = {}
    for finding in summary["findings"]:
        path = finding["repro"]
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(out_dir, os.path.relpath(path, os.path.basename(out_dir)))
        with open(path) as f:
            repros[finding["signature"]] = json.load(f)
    return summary, repros


def main():
    a_dir, b_dir, a_policy, b_policy = sys.argv[1:5]
    a, a_repros = load(a_dir)
    b, b_repros = load(b_dir)
    dir_of = lambda p: p.replace(":", "-").replace("/", "-").replace(" ", "_")
    names_a = [(a_dir, "OUT"), (dir_of(a_policy), "POLICY"), (a_policy, "POLICY")]
    names_b = [(b_dir, "OUT"), (dir_of(b_policy), "POLICY"), (b_policy, "POLICY")]
    diffs = []
    for key in ("counts", "findings", "seeds", "matrix"):
        if normalise(a.get(key), names_a) != normalise(b.get(key), names_b):
            diffs.append(f"summary.json {key} differs")
    if sorted(a_repros) != sorted(b_repros):
        diffs.append(f"repro signatures differ: {sorted(a_repros)} vs {sorted(b_repros)}")
    for sig in sorted(set(a_repros) & set(b_repros)):
        ra, rb = a_repros[sig], b_repros[sig]
        pa, pb = policy_of_repro(ra["scenario"]["policy"]), policy_of_repro(rb["scenario"]["policy"])
        ra["scenario"]["policy"] = rb["scenario"]["policy"] = "POLICY"
        if pa != a_policy or pb != b_policy:
            diffs.append(f"{sig}: repro policies {pa!r}, {pb!r}")
        if normalise(ra, names_a) != normalise(rb, names_b):
            fields = [k for k in set(ra) | set(rb) if normalise(ra.get(k), names_a) != normalise(rb.get(k), names_b)]
            diffs.append(f"{sig}: repro differs in {sorted(fields)}")
    counts = a.get("counts", {})
    print(f"{len(a_repros)} findings, counts {json.dumps(counts, sort_keys=True)[:300]}")
    for d in diffs:
        print("DIFF:", d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
