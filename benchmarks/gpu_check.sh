#!/usr/bin/env bash
# The GPU verification, as one script for a machine with a CUDA GPU, CuPy and
# PyTorch (run from the repository root): the test suite with the "cuda" device, the GPT
# trainer for 300 steps on the GPU, and the side-by-side benchmark at shakespeare-char,
# batch 64. Each part prints its own output; the script stops at the first failure.
#
#     bash benchmarks/gpu_check.sh 2>&1 | tee gpu_check.log
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import cupy, torch
import tinygrad_attn as ta
print("cupy", cupy.__version__, "torch", torch.__version__, "GPU", torch.cuda.get_device_name(0))
assert ta.cuda.is_available(), "tinygrad_attn sees no GPU"
PY
# 1. every device-parametrized test on the real GPU ("cuda" params; -k cuda selects them)
python -m pytest -q -k "cuda" -p no:cacheprovider
# 2. training on the GPU, 300 steps, progress bar off (the log shows loss and memory)
python examples/train_gpt.py --device cuda --steps 300 --eval-every 100 --no-progress
# 3. the comparison against PyTorch eager on the same GPU
python benchmarks/vs_torch.py --device cuda --configs shakespeare-b64 --policy save,recompute
