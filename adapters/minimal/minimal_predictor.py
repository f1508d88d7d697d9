#!/usr/bin/env python3
"""A minimal external predictor for vramfuzz (protocol vramfuzz.predictor/1, see
docs/predictor-protocol.md). No dependencies beyond the standard library.

Its accounting is the simplest one a runtime could have: every model a stage loads goes to the
device whole, nothing is offloaded, and a forward needs the weights on the device plus a fixed
activation allowance (--allowance MiB, default 1024). It is a template for an adapter, and what
vramfuzz's protocol tests run: a campaign against it finds exactly the cases where "load it all
and keep 1 GiB" is wrong.

    vramfuzz fuzz --policy exec:"python3 adapters/minimal/minimal_predictor.py" --cases 200
"""
import argparse
import json
import sys

MIB = 1 << 20


# Storage per dtype as (elements per block, bytes per block), vramfuzz's rules (harness/core/dtype.cpp):
# block types round each row of the innermost dimension up to whole blocks.
DTYPES = {
    "fp32": (1, 4), "fp16": (1, 2), "bf16": (1, 2), "fp8_e4m3fn": (1, 1), "fp8_e5m2": (1, 1), "int8": (1, 1),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
}


def tensor_bytes(t):
    block, size = DTYPES[t["dtype"]]
    shape = t["shape"] or [1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * -(-shape[-1] // block) * size


def module_bytes(module):
    return sum(tensor_bytes(t) for t in module["tensors"])


def expand(modules):
    """The request writes runs of equal modules NAME.0, NAME.1, ... once, with "repeat": N."""
    for m in modules:
        n = m.get("repeat")
        if n is None:
            yield m
        else:
            for i in range(n):
                yield dict(m, name=f"{m['name']}.{i}")


def plan(request, allowance):
    scenario = request["scenario"]
    models = scenario["models"]
    modules = [list(expand(m["modules"])) for m in models]
    sizes = [[module_bytes(mod) for mod in mods] for mods in modules]
    on_device = [False] * len(models)
    index = {m["id"]: i for i, m in enumerate(models)}
    workload = scenario.get("workload", {})
    batch = workload.get("batch", 1)
    cfg = workload.get("cfg", 1.0)
    loads, stages = [], []
    for k, stage in enumerate(scenario["pipeline"]):
        op, model = stage["op"], index[stage["model"]]
        if op == "load":
            on_device[model] = True
            loads.append({"stage": k, "resident": [mod["name"] for mod in modules[model]], "lowvram": [], "offload_buffer": 0,
                          "log_line": f"loaded completely; {sum(sizes[model]) / MIB:.2f} MB loaded, full load: True"})
        elif op == "unload":
            on_device[model] = False
        resident = sum(sum(sizes[i]) for i in range(len(models)) if on_device[i])
        checked = op != "unload"
        stages.append({"checked": checked, "resident_total": resident, "offload_buffer": 0,
                       "activation_allowance": allowance, "run_batch": batch, "passes": 2 if cfg > 1 else 1,
                       "predicted_peak": resident + (allowance if checked else 0)})
    return {"reserve": 0, "loads": loads, "stages": stages}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allowance", type=int, default=1024, help="activation allowance in MiB")
    args = ap.parse_args()
    out = sys.stdout
    # supports.overrides: the policy overrides it applies. This planner has no reserve or other
    # constant, so none: vramfuzz then refuses --reserve / --set against it instead of judging
    # plans that ignored them.
    out.write(json.dumps({"schema": "vramfuzz.predictor/1", "type": "hello", "name": "minimal-python",
                          "version": "1", "runtime": "comfy:dec2025", "supports": {"overrides": []}}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply = {"type": "plan", "id": request["id"], "plan": plan(request, args.allowance * MIB)}
        except (KeyError, ValueError, TypeError) as e:
            reply = {"type": "error", "id": request.get("id", 0), "message": f"cannot plan: {e!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
