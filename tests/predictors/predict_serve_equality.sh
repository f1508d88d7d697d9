#!/bin/sh
# The external-predictor protocol's proof: a campaign under
# --policy exec:"vramfuzz predict-serve --policy P" must give the same cases, counts, findings and
# shrunk repros as the same campaign under --policy P (only the policy's name differs), for a
# classic and a dynamic-VRAM preset. Usage: predict_serve_equality.sh VRAMFUZZ WORKDIR
set -eu
vramfuzz=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cd "$work"
status=0
for policy in comfy:dec2025 comfy:sep2026; do
  dir=$(echo "$policy" | tr ':' '-')
  for side in builtin served; do
    if [ "$side" = builtin ]; then p=$policy; else p="exec:$vramfuzz predict-serve --policy $policy"; fi
    rc=0
    "$vramfuzz" fuzz --backend sim --policy "$p" --cases 300 --seed 11 --out "$dir-$side" >"$dir-$side.log" 2>&1 || rc=$?
    # 0 or 1 (findings); anything else is a failure of the run itself.
    if [ "$rc" -gt 1 ]; then
      echo "$side campaign under $p exited $rc:"
      tail -20 "$dir-$side.log"
      exit 1
    fi
  done
  echo "== $policy"
  python3 "$here/compare_campaigns.py" "$dir-builtin" "$dir-served" "$policy" "exec:vramfuzz predict-serve $policy" || status=1
done
exit $status
