#!/usr/bin/env bash
# Creates the Python environment the ComfyUI adapter runs in.
#
#   adapters/comfyui/setup.sh [DIR]      (DIR defaults to /work/comfy-venv)
#   COMFYUI_PATH=/path/to/ComfyUI adapters/comfyui/setup.sh [DIR]
#                                        (also installs the comfy-aimdo / comfy-kitchen versions
#                                         that tree's requirements.txt pins)
#
# Installs torch from PyPI (the Linux x86_64 wheel is a CUDA build: about 3 GB
# to download, 6 GB installed; it imports and runs the adapter without a GPU)
# and the Python packages ComfyUI imports at load time. It does NOT fetch
# ComfyUI itself: give the adapter your own checkout with --comfyui PATH or
# COMFYUI_PATH (any tree with comfy/model_management.py and comfy/ops.py).
set -euo pipefail
DIR=${1:-/work/comfy-venv}
PY=${PYTHON:-python3}

if [ ! -x "$DIR/bin/python" ]; then
    echo "setup: creating venv $DIR" >&2
    "$PY" -m venv "$DIR"
fi
PIP=("$DIR/bin/python" -m pip install --disable-pip-version-check)

echo "setup: installing torch (large download)" >&2
"${PIP[@]}" torch
# torchvision only for imports some comfy modules make; its deps would pull a
# second torch, so install it without them.
"${PIP[@]}" --no-deps torchvision torchaudio || echo "setup: torchvision/torchaudio not installed (optional)" >&2
echo "setup: installing ComfyUI's import-time dependencies" >&2
"${PIP[@]}" numpy safetensors pyyaml psutil tqdm einops scipy pillow \
    transformers tokenizers sentencepiece kornia pydantic av spandrel torchsde simpleeval blake3
# comfy.model_management imports comfy_aimdo (and comfy.float comfy_kitchen): the versions the
# tree pins when COMFYUI_PATH is given, else the newest.
pins=()
if [ -n "${COMFYUI_PATH:-}" ] && [ -f "$COMFYUI_PATH/requirements.txt" ]; then
    mapfile -t pins < <(grep -E '^(comfy-aimdo|comfy-kitchen)==' "$COMFYUI_PATH/requirements.txt")
fi
[ ${#pins[@]} -gt 0 ] || pins=(comfy-aimdo comfy-kitchen)
"${PIP[@]}" "${pins[@]}"

"$DIR/bin/python" - <<'PY'
import torch
print("setup: torch", torch.__version__, "cuda available:", torch.cuda.is_available())
PY
echo "setup: done. Run the adapter with $DIR/bin/python adapters/comfyui/comfyui_predictor.py --comfyui PATH" >&2
