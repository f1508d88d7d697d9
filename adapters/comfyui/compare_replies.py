#!/usr/bin/env python3
"""Compare two external predictors reply by reply, field by field (vramfuzz.predictor/1).

    compare_replies.py REQUESTS.jsonl --a "CMD A" --b "CMD B" [--json OUT] [--examples 3]

REQUESTS.jsonl holds request lines as vramfuzz sends them (capture them with a campaign whose
predictor is `tee FILE | vramfuzz predict-serve --policy comfy:dec2025`). Each command is started
once (through /bin/sh), fed every request, and must say hello first. Defaults: A is the ComfyUI
adapter (COMFYUI_PYTHON, COMFYUI_PATH), B is `build/vramfuzz predict-serve --policy comfy:dec2025`.

Compared: per load, the resident and lowvram module sets, offload_buffer, usable, loaded,
offloaded, uncounted, full_load, evictions (model, module set), free_before, est_max, est_min,
extra_mem, min_req, lowvram_patches, the walk order (`sorted`) and the log line; per stage,
resident_total, offload_buffer, activation_allowance, run_batch, passes, predicted_peak; the
plan's reserve. Numbers agree within --tolerance bytes (default 16: ComfyUI computes some
budgets in floating point, 0.8 GiB is not a whole byte). Prints counts of agreeing and
differing fields (counts exactly) and, per field, examples with the case's context; --json writes every
difference.
"""
import argparse
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

LOAD_NUMBERS = ["offload_buffer", "usable", "loaded", "offloaded", "uncounted", "free_before", "est_max", "est_min",
                "extra_mem", "min_req", "lowvram_patches"]
STAGE_NUMBERS = ["resident_total", "offload_buffer", "activation_allowance", "run_batch", "passes", "predicted_peak"]
MIB = 1 << 20
COUNTS = {"run_batch", "passes", "lowvram_patches"}  # compared exactly, not within the byte tolerance


def run(cmd, lines):
    p = subprocess.run(["/bin/sh", "-c", cmd], input="".join(lines), capture_output=True, text=True)
    out = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    if not out or out[0].get("type") != "hello":
        sys.exit(f"compare_replies: {cmd!r} said no hello (exit {p.returncode}); stderr tail:\n{p.stderr[-2000:]}")
    return out[0], {r.get("id"): r for r in out[1:]}, p.stderr


def context(req):
    s = req["scenario"]
    parts = []
    for m in s["models"]:
        dts = Counter(t["dtype"] for mod in m["modules"] for t in mod["tensors"])
        raw = sum(1 for mod in m["modules"] if mod.get("cast_hook") is False)
        parts.append(f"{m['id']}({m['kind']}/{m['family']} compute={m.get('compute')} lora={m.get('lora')} "
                     f"dtypes={dict(dts)} raw_modules={raw})")
    pol = s.get("policy")
    ov = pol.get("overrides") if isinstance(pol, dict) else None
    pipe = " ".join(f"{st['op']}:{st['model']}" for st in s["pipeline"])
    v = req["view"]
    return (f"id {req['id']}: {'; '.join(parts)} | pipeline {pipe} | free {v['free'] / MIB:.2f} MiB of "
            f"{v['total'] / MIB:.0f} MiB | workload {s.get('workload')} | streams {s.get('offload_streams', 'default')}"
            + (f" | overrides {ov}" if ov else ""))


def num(x):
    return 0 if x is None else x


def module_names(req):
    """Each model's module names in request order (repeats expanded): replies may name a module
    by its index in this list."""
    out = {}
    for m in req["scenario"]["models"]:
        names = []
        for mod in m.get("modules", []):
            n = mod.get("repeat")
            names += [mod["name"]] if n is None else [f"{mod['name']}.{i}" for i in range(n)]
        out[m["id"]] = names
    return out


def by_name(values, names):
    return [names[v] if isinstance(v, int) and 0 <= v < len(names) else v for v in values]


def normalize(req, reply):
    """Module indices in a reply become names, so that replies of both kinds compare."""
    if reply.get("type") != "plan":
        return reply
    names = module_names(req)
    pipeline = req["scenario"]["pipeline"]
    for lp in reply["plan"].get("loads", []):
        model = lp.get("model") or pipeline[lp["stage"]]["model"]
        own = names.get(model, [])
        for key in ("resident", "lowvram", "sorted"):
            if key in lp:
                lp[key] = by_name(lp[key], own)
        for ev in lp.get("evictions", []):
            ev["modules"] = by_name(ev.get("modules", []), names.get(ev["model"], []))
    return reply


def compare(req, a, b, tol, diffs, agree):
    rid = req["id"]
    a, b = normalize(req, a), normalize(req, b)

    def rec(field, va, vb, detail=None):
        diffs[field].append({"id": rid, "a": va, "b": vb, "detail": detail})

    if a.get("type") != "plan" or b.get("type") != "plan":
        if a.get("type") != b.get("type"):
            rec("reply.type", a.get("type") + ": " + a.get("message", ""), b.get("type") + ": " + b.get("message", ""))
        else:
            agree["reply.type"] += 1
        return
    pa, pb = a["plan"], b["plan"]
    if abs(num(pa.get("reserve")) - num(pb.get("reserve"))) <= tol:
        agree["plan.reserve"] += 1
    else:
        rec("plan.reserve", pa.get("reserve"), pb.get("reserve"))
    for la, lb in zip(pa["loads"], pb["loads"]):
        tag = f"load[{la['stage']}] {la.get('model', '')}"
        for key in ("resident", "lowvram"):
            sa, sb = set(la.get(key, [])), set(lb.get(key, []))
            if sa == sb:
                agree["load." + key] += 1
            else:
                rec("load." + key, len(sa), len(sb),
                    f"{tag}: only A {sorted(sa - sb)[:6]}{'...' if len(sa - sb) > 6 else ''} ({len(sa - sb)}), "
                    f"only B {sorted(sb - sa)[:6]}{'...' if len(sb - sa) > 6 else ''} ({len(sb - sa)})")
        for key in LOAD_NUMBERS:
            va, vb = num(la.get(key)), num(lb.get(key))
            if abs(va - vb) <= (0 if key in COUNTS else tol):
                agree["load." + key] += 1
            else:
                rec("load." + key, va, vb, f"{tag}: A-B = {(va - vb) / MIB:+.2f} MiB" if key != "lowvram_patches" else tag)
        fa, fb = la.get("full_load", not la.get("lowvram")), lb.get("full_load", not lb.get("lowvram"))
        if fa == fb:
            agree["load.full_load"] += 1
        else:
            rec("load.full_load", fa, fb, tag)
        ea = {(e["model"], frozenset(e.get("modules", []))) for e in la.get("evictions", [])}
        eb = {(e["model"], frozenset(e.get("modules", []))) for e in lb.get("evictions", [])}
        if ea == eb:
            agree["load.evictions"] += 1
        else:
            rec("load.evictions", [(m, len(s)) for m, s in ea], [(m, len(s)) for m, s in eb], tag)
        if "sorted" in la and "sorted" in lb:
            if list(la["sorted"]) == list(lb["sorted"]):
                agree["load.sorted"] += 1
            else:
                first = next((k for k, (x, y) in enumerate(zip(la["sorted"], lb["sorted"])) if x != y),
                             min(len(la["sorted"]), len(lb["sorted"])))
                rec("load.sorted", len(la["sorted"]), len(lb["sorted"]),
                    f"{tag}: first difference at {first}: A {la['sorted'][first:first + 3]} B {lb['sorted'][first:first + 3]}")
        if la.get("log_line", "") == lb.get("log_line", ""):
            agree["load.log_line"] += 1
        else:
            rec("load.log_line", la.get("log_line", ""), lb.get("log_line", ""), tag)
    if len(pa["loads"]) != len(pb["loads"]):
        rec("plan.loads", len(pa["loads"]), len(pb["loads"]))
    for k, (sa, sb) in enumerate(zip(pa["stages"], pb["stages"])):
        op = req["scenario"]["pipeline"][k]
        tag = f"stage {k} {op['op']} {op['model']}"
        for key in STAGE_NUMBERS:
            va, vb = num(sa.get(key)), num(sb.get(key))
            if abs(va - vb) <= (0 if key in COUNTS else tol):
                agree["stage." + key] += 1
            else:
                rec("stage." + key, va, vb, f"{tag}: A-B = {(va - vb) / MIB:+.2f} MiB" if key not in ("run_batch", "passes") else tag)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests")
    ap.add_argument("--a", default=None, help="predictor A (default: the ComfyUI adapter)")
    ap.add_argument("--b", default=None, help="predictor B (default: vramfuzz predict-serve --policy comfy:dec2025)")
    ap.add_argument("--limit", type=int, default=0, help="compare the first N requests only")
    ap.add_argument("--tolerance", type=int, default=16, help="bytes within which numbers agree (default 16)")
    ap.add_argument("--examples", type=int, default=3, help="examples printed per differing field")
    ap.add_argument("--json", help="write every difference here")
    args = ap.parse_args()
    py = os.environ.get("COMFYUI_PYTHON", "/work/comfy-venv/bin/python")
    comfy = os.environ.get("COMFYUI_PATH", "/work/comfyui-tree")
    a_cmd = args.a or f"{py} {os.path.join(HERE, 'comfyui_predictor.py')} --comfyui {comfy}"
    b_cmd = args.b or f"{os.path.join(REPO, 'build', 'vramfuzz')} predict-serve --policy comfy:dec2025"
    lines = [l for l in open(args.requests) if l.strip()]
    if args.limit:
        lines = lines[:args.limit]
    reqs = [json.loads(l) for l in lines]
    # Requests captured from a predictor that said supports.spec_refs name a model's spec by its
    # number after the first time: fill them in (for this script's own use; both predictors are
    # fed the lines as captured, and must then both say spec_refs).
    specs = {}
    for r in reqs:
        for m in r["scenario"]["models"]:
            ref = m.get("spec_ref")
            if ref is None:
                continue
            if "modules" in m:
                specs[ref] = {k: m[k] for k in ("kind", "family", "memory_usage_factor", "arch", "modules") if k in m}
            elif ref in specs:
                for k, v in specs[ref].items():
                    m.setdefault(k, v)
    ha, ra, _ = run(a_cmd, lines)
    hb, rb, _ = run(b_cmd, lines)
    print(f"A: {ha.get('name')} {ha.get('version')} ({ha.get('runtime')})   B: {hb.get('name')} {hb.get('version')} ({hb.get('runtime')})")
    diffs, agree = defaultdict(list), Counter()
    for req in reqs:
        a, b = ra.get(req["id"]), rb.get(req["id"])
        if a is None or b is None:
            diffs["reply.missing"].append({"id": req["id"], "a": a is not None, "b": b is not None})
            continue
        compare(req, a, b, args.tolerance, diffs, agree)
    gguf = {r["id"] for r in reqs if any(t["dtype"].lower().startswith("q") for m in r["scenario"]["models"]
                                          for mod in m["modules"] for t in mod["tensors"])}
    ids_diff = {d["id"] for ds in diffs.values() for d in ds}
    print(f"cases with GGUF tensors: {len(gguf)} (differing: {len(ids_diff & gguf)}); "
          f"without: {len(reqs) - len(gguf)} (differing: {len(ids_diff - gguf)})")
    errors_a = sum(1 for r in ra.values() if r.get("type") == "error")
    errors_b = sum(1 for r in rb.values() if r.get("type") == "error")
    differing_cases = len({d["id"] for ds in diffs.values() for d in ds})
    print(f"{len(reqs)} requests; error replies A {errors_a}, B {errors_b}; cases with any difference: {differing_cases}")
    fields = sorted(set(agree) | set(diffs))
    print(f"{'field':28} {'agree':>7} {'differ':>7} {'of which GGUF cases':>20}")
    for f in fields:
        print(f"{f:28} {agree.get(f, 0):7} {len(diffs.get(f, [])):7} {sum(1 for d in diffs.get(f, []) if d['id'] in gguf):20}")
    ctx = {r["id"]: r for r in reqs}
    for f in fields:
        if not diffs.get(f):
            continue
        print(f"\n== {f}: {len(diffs[f])} differences; examples:")
        shown = [d for d in diffs[f] if d["id"] not in gguf][:args.examples]
        shown += [d for d in diffs[f] if d["id"] in gguf][:max(1, args.examples - len(shown))]
        for d in shown:
            print(f"  {'[GGUF] ' if d['id'] in gguf else ''}A={d['a']!r} B={d['b']!r} {d.get('detail') or ''}")
            if d["id"] in ctx:
                print(f"    {context(ctx[d['id']])[:600]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"agree": agree, "diffs": diffs}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
