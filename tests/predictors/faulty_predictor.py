#!/usr/bin/env python3
"""An external predictor that misbehaves on purpose, for vramfuzz's protocol tests: each mode is
one way a real adapter can fail. Built on adapters/minimal/minimal_predictor.py's planner.

    faulty_predictor.py MODE [STATE_FILE]

modes: ok, timeout (hello, then never answers), crash (exits 3 on the first request), crash-once
(crashes on the first request of the first process only: STATE_FILE marks it), malformed (a
reply that is not JSON), schema (hello in vramfuzz.predictor/2), no-hello (exits at once),
unknown-module (a resident module the case does not have), both (a module resident and
offloaded), error (an error reply), bad-id (a reply to another request), error-after-N (N good
replies, then error replies), crash-after-N (N good replies, then it exits 3; every restart
exits 3 on its first request: STATE_FILE marks the first process), honours-reserve (a working
predictor whose hello says supports.overrides ["reserve"], and whose plan's reserve is the
request's `reserve` override in bytes), needs-ahead (answers request k only once request k+1 has
arrived; one that does not arrive within 0.3 s of k gets an error reply "not sent ahead": a
campaign that pipelines its requests gets that error on its last case only), slow (each reply
after 0.2 s), crash-second-once (the first process answers its first request and exits 3 on its
second; STATE_FILE marks it; later processes work). crash-after-N also touches STATE_FILE.exited as
it exits; any mode ending in -orphan first starts a `sleep 30` that keeps its stdout open.
"""
import json
import os
import select
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters", "minimal"))
import minimal_predictor  # noqa: E402

MIB = 1 << 20


def say(obj):
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def lines_ahead():
    """Yields (line, whether the next line had arrived within 0.3 s of it), reading stdin unbuffered."""
    buf = b""
    pending = None
    while True:
        while b"\n" not in buf:
            ready, _, _ = select.select([0], [], [], 0.3 if pending is not None else None)
            if not ready:
                yield pending, False
                pending = None
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                if pending is not None:
                    yield pending, False
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        if pending is not None:
            yield pending, True
        pending = line.decode()


def main():
    mode = sys.argv[1]
    state = sys.argv[2] if len(sys.argv) > 2 else None
    if mode == "no-hello":
        sys.exit(5)
    hello = {"schema": "vramfuzz.predictor/2" if mode == "schema" else "vramfuzz.predictor/1", "type": "hello",
             "name": f"faulty-{mode}" + (f"-{os.path.basename(state)}" if state else ""), "version": "1", "runtime": "comfy:dec2025"}
    if mode == "honours-reserve":
        hello["supports"] = {"overrides": ["reserve"]}
    say(hello)
    if mode.endswith("-orphan"):
        # A helper that keeps our stdout open after we exit (and never reads stdin).
        subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
        mode = mode[: -len("-orphan")]
    good = 0
    if mode.startswith("crash-after-") and state:
        if os.path.exists(state):
            mode = "crash"
        else:
            open(state, "w").close()
    for line in (lines_ahead() if mode == "needs-ahead" else sys.stdin):
        if mode == "needs-ahead":
            line, ahead = line
            if not ahead:
                say({"type": "error", "id": json.loads(line)["id"], "message": "not sent ahead: no request followed it within 0.3 s"})
                continue
        request = json.loads(line)
        rid = request["id"]
        for kind in ("error-after-", "crash-after-"):
            if mode.startswith(kind) and good >= int(mode[len(kind):]):
                if kind == "crash-after-":
                    if state:
                        open(state + ".exited", "w").close()  # for a test to wait on
                    sys.exit(3)
                say({"type": "error", "id": rid, "message": "no planner for this one"})
                break
        else:
            good += 1
            kind = None
        if kind is not None:
            continue
        if mode == "timeout":
            time.sleep(3600)
        if mode == "slow":
            time.sleep(0.2)
        if mode == "crash-second-once" and state and not os.path.exists(state) and good == 2:
            open(state, "w").close()
            sys.exit(3)
        if mode == "crash":
            sys.exit(3)
        if mode == "crash-once" and state and not os.path.exists(state):
            open(state, "w").close()
            sys.exit(3)
        if mode == "malformed":
            say("{this is not json")
            continue
        if mode == "error":
            say({"type": "error", "id": rid, "message": "no planner for this model family"})
            continue
        plan = minimal_predictor.plan(request, 1024 * MIB)
        if mode == "unknown-module":
            plan["loads"][0]["resident"][0] = "no.such.module"
        if mode == "honours-reserve":
            pol = request["scenario"].get("policy")
            given = pol.get("overrides", {}).get("reserve") if isinstance(pol, dict) else None
            if given is not None:  # canonical sizes as vramfuzz writes them: a number of bytes or N[KMG]iB
                units = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}
                text = str(given)
                unit = next((u for u in units if text.endswith(u)), "")
                plan["reserve"] = int(float(text[:-len(unit)] if unit else text) * units.get(unit, 1))
        if mode == "both":
            plan["loads"][0]["lowvram"] = [plan["loads"][0]["resident"][0]]
        say({"type": "plan", "id": rid + 1 if mode == "bad-id" else rid, "plan": plan})


if __name__ == "__main__":
    main()
