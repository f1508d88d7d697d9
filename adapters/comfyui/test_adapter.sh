#!/usr/bin/env bash
# Checks the ComfyUI adapter against a real ComfyUI tree. Needs:
#   COMFYUI_PATH    a ComfyUI checkout (default /work/comfyui-tree)
#   COMFYUI_PYTHON  the python of a venv made by adapters/comfyui/setup.sh (default /work/comfy-venv/bin/python)
#   VRAMFUZZ        the vramfuzz binary (default build/vramfuzz of this checkout)
# Without them it prints "SKIPPED: ..." and exits 77 (ctest SKIP_RETURN_CODE 77).
# (a) the FLUX.2 text encoder at 11727.62 MiB free on a 12 GiB device: the real planner's line is
#     10508.42 MB usable, 9385.59/9385.60 MB loaded, 7795.00 MB offloaded, 1120.00 MB buffer,
#     as comfy:dec2025 prints it;
# (b) a 50-case sim campaign under the adapter has no error verdicts;
# (c) dynamic VRAM (--runtime comfy:sep2026): the same text encoder through the real
#     ModelPatcherDynamic prints "17180MB Staged. 0 patches attached. Force pre-loaded 271
#     weights: 610 KB." and `vramfuzz diff` of comfy:sep2026 against it finds no difference in
#     the staging order, the slices or the force-loaded set over 30 cases.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
COMFYUI_PATH=${COMFYUI_PATH:-/work/comfyui-tree}
COMFYUI_PYTHON=${COMFYUI_PYTHON:-/work/comfy-venv/bin/python}
VRAMFUZZ=${VRAMFUZZ:-$REPO/build/vramfuzz}

missing=()
[ -f "$COMFYUI_PATH/comfy/model_management.py" ] || missing+=("a ComfyUI tree at COMFYUI_PATH=$COMFYUI_PATH")
[ -x "$COMFYUI_PYTHON" ] || missing+=("the adapter's python at COMFYUI_PYTHON=$COMFYUI_PYTHON (adapters/comfyui/setup.sh)")
if [ -x "$COMFYUI_PYTHON" ] && ! "$COMFYUI_PYTHON" -c "import torch" >/dev/null 2>&1; then
    missing+=("torch in $COMFYUI_PYTHON")
fi
[ -x "$VRAMFUZZ" ] || missing+=("the vramfuzz binary at VRAMFUZZ=$VRAMFUZZ")
if [ ${#missing[@]} -gt 0 ]; then
    printf '******** SKIPPED: ComfyUI adapter test: missing %s\n' "$(IFS=';'; echo "${missing[*]}")"
    exit 77
fi

ADAPTER="$COMFYUI_PYTHON $HERE/comfyui_predictor.py --comfyui $COMFYUI_PATH"
TMP=$(mktemp -d /tmp/comfyui-adapter-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail=0

# (a) the FLUX.2 text encoder
"$VRAMFUZZ" plan "$HERE/flux2-te-12gib.json" --policy comfy:dec2025 > "$TMP/emulation.txt" 2>&1
"$VRAMFUZZ" --log-level debug plan "$HERE/flux2-te-12gib.json" --policy exec:"$ADAPTER" > "$TMP/adapter.txt" 2>&1
real=$(grep -o '\[comfyui\] loaded partially;.*' "$TMP/adapter.txt" | head -1 | sed 's/^\[comfyui\] //')
emul=$(grep -o 'loaded partially;.*' "$TMP/emulation.txt" | head -1)
echo "real ComfyUI:     $real"
echo "comfy:dec2025:    $emul"
want='^loaded partially; 10508\.42 MB usable, 9385\.(59|60) MB loaded, 7795\.00 MB offloaded, 1120\.00 MB buffer reserved, lowvram patches: 0$'
if [[ "$real" =~ $want ]]; then
    echo "ok (a): the real planner's line has the reference figures"
else
    echo "FAIL (a): the adapter's line is not the reference's (10508.42 / 9385.59-60 / 7795.00 / 1120.00)"
    tail -20 "$TMP/adapter.txt"
    fail=1
fi
if [[ "$emul" =~ $want ]]; then
    echo "ok (a): comfy:dec2025 prints the same figures"
else
    echo "note (a): comfy:dec2025 prints other figures than the real planner"
fi

# (b) a short campaign
"$VRAMFUZZ" fuzz --backend sim --cases 50 --seed 1 --no-shrink --progress off --out "$TMP/campaign" \
    --policy exec:"$ADAPTER" > "$TMP/campaign.txt" 2>&1
rc=$?
if [ ! -f "$TMP/campaign/summary.json" ]; then
    echo "FAIL (b): the campaign wrote no summary.json (exit $rc)"; tail -30 "$TMP/campaign.txt"; exit 1
fi
read -r cases errors <<<"$("$COMFYUI_PYTHON" -c "
import json, sys
s = json.load(open(sys.argv[1]))
print(s['counts']['cases'], s['counts']['errors'])" "$TMP/campaign/summary.json")"
echo "campaign: $cases cases, $errors errors (exit $rc)"
if [ "$cases" -ne 50 ] || [ "$errors" -ne 0 ]; then
    echo "FAIL (b): expected 50 cases and no errors"
    grep -i "error" "$TMP/campaign.txt" | grep -v "INFO" | head -20
    fail=1
else
    echo "ok (b): 50 cases, no error verdicts"
fi

# (c) dynamic VRAM
DYN="$ADAPTER --runtime comfy:sep2026"
"$VRAMFUZZ" --log-level debug plan "$HERE/flux2-te-12gib.json" --policy exec:"$DYN" > "$TMP/dynamic.txt" 2>&1
line=$(grep -o '\[comfyui\] Model .* prepared for dynamic VRAM loading\..*' "$TMP/dynamic.txt" | head -1 | sed 's/^\[comfyui\] //')
echo "real ComfyUI (dynamic): $line"
if [[ "$line" =~ 'prepared for dynamic VRAM loading. 17180MB Staged. 0 patches attached. Force pre-loaded 271 weights: 610 KB.'$ ]]; then
    echo "ok (c): ModelPatcherDynamic staged the reference figures"
else
    echo "FAIL (c): the dynamic load's line is not the reference's (17180MB staged, 271 weights, 610 KB)"
    tail -20 "$TMP/dynamic.txt"
    fail=1
fi
"$VRAMFUZZ" diff --policy comfy:sep2026 --against exec:"$DYN" --cases 30 --seed 2 --tolerance 16B --no-shrink --no-verdicts \
    --out "$TMP/dyndiff" > "$TMP/dyndiff.txt" 2>&1
rc=$?
if [ ! -f "$TMP/dyndiff/diff.json" ]; then
    echo "FAIL (c): the dynamic diff wrote no diff.json (exit $rc)"; tail -30 "$TMP/dyndiff.txt"; exit 1
fi
staging=$("$COMFYUI_PYTHON" -c "
import json, sys
d = json.load(open(sys.argv[1]))
bad = [g['key'] for g in d['groups'] if 'staging' in g['key'] or 'error' in g['key']]
print(d['counts']['cases'], len(bad), ';'.join(bad))" "$TMP/dyndiff/diff.json")
read -r dcases dbad dkeys <<<"$staging"
echo "dynamic diff: $dcases cases, $dbad groups touching the staging or unplanned"
if [ "$dcases" -ne 30 ] || [ "$dbad" -ne 0 ]; then
    echo "FAIL (c): the staging differs from the real ModelPatcherDynamic's (or a case was not planned): $dkeys"
    fail=1
else
    echo "ok (c): staging order, slices and force-loaded modules as the real ModelPatcherDynamic's"
fi
exit $fail
