#!/usr/bin/env python3
"""The most trivial external predictor, for bench/bench_protocol.cpp: it answers each request with
a reply recorded before, so a campaign over it costs the protocol alone (the harness's writing,
the pipes, its reading of the replies), not a planner's work.

    canned_predictor.py record FILE -- COMMAND...   serve COMMAND (another predictor), writing its
                                                    hello, each request and each reply to FILE
    canned_predictor.py replay FILE                 answer the k-th request with FILE's k-th reply

A replayed campaign must send the same requests in the same order as the recorded one (same
seed, cases and options); ids may differ (they keep counting across restarts). A request that
is not the recorded one, id aside, gets an error reply. Both modes say hello under their own
names (a campaign holds one predictor per name).
"""
import json
import os
import subprocess
import sys


def split_id(line):
    """(id, the rest after it) of a request or reply line: {"type":"...","id":N,REST."""
    head, rest = line.split(b'"id":', 1)
    number, rest = rest.split(b",", 1)
    return int(number), head, rest


def main():
    mode, path = sys.argv[1], sys.argv[2]
    out = sys.stdout.buffer
    name = os.path.basename(path)
    if mode == "record":
        command = sys.argv[sys.argv.index("--") + 1:]
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with open(path, "wb") as log:
            hello = child.stdout.readline()
            log.write(hello)
            renamed = json.loads(hello)
            renamed["name"] = "canned-record-" + name
            out.write(json.dumps(renamed).encode() + b"\n")
            out.flush()
            for line in sys.stdin.buffer:
                child.stdin.write(line)
                child.stdin.flush()
                reply = child.stdout.readline()
                log.write(line if line.endswith(b"\n") else line + b"\n")
                log.write(reply)
                out.write(reply)
                out.flush()
        child.stdin.close()
        sys.exit(child.wait())
    with open(path, "rb") as log:
        recorded = log.read().split(b"\n")
    hello = json.loads(recorded[0])
    hello["name"] = "canned-" + name
    out.write(json.dumps(hello).encode() + b"\n")
    out.flush()
    k = 1
    for line in sys.stdin.buffer:
        rid, _, rest = split_id(line.rstrip(b"\n"))
        ok = k + 1 < len(recorded) and split_id(recorded[k])[2] == rest
        if ok:
            _, head, tail = split_id(recorded[k + 1])
            out.write(head + b'"id":' + str(rid).encode() + b"," + tail + b"\n")
        else:
            out.write(json.dumps({"type": "error", "id": rid, "message": "not the recorded request"}).encode() + b"\n")
        out.flush()
        k += 2


if __name__ == "__main__":
    main()
