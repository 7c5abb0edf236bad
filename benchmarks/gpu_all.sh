#!/usr/bin/env bash
# The GPU checks as one prepared run (device time is scarce): proxy-150m tokens/s, MFU and the
# planner's memory estimate in a separate loop; async-checkpoint blocking time and bandwidth for
# proxy-150m (these two need only the machine's torch and this repository); then the product's own
# stage worker.
#   OUT=/some/dir bash benchmarks/gpu_all.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/gpu.txt"
timeout 270 python3 benchmarks/gpu_proxy150m.py --micro-batches 8 16 --steps 20 --warmup 6 --out "$OUT/proxy150m.json" 2>&1 | tee "$OUT/proxy150m.log"
timeout 120 python3 benchmarks/checkpoint_async.py --device cuda --world-size 1 --model proxy-150m --repeat 3 2>&1 | tee "$OUT/checkpoint.log"
# The product's own stage worker on proxy-150m, the figure that counts: eager fp32,
# bf16, bf16 + compile, bf16 + compile + activation checkpointing, with MFU and predicted against
# measured step time. Needs the project's dependencies beside torch (numpy, tokenizers); where
# they are missing it says so and moves on.
if python3 -c "import ito_assets.runtime.worker.main" 2>/dev/null; then
  timeout 600 python3 benchmarks/stage_layouts.py --model proxy-150m --sequence-length 2048 --batch 16 \
    --micro-batch 8 --gpu H200 --steps 20 2>&1 | tee "$OUT/stage_layouts.log"
else
  echo "stage_layouts: the project's dependencies are not installed on this machine" | tee "$OUT/stage_layouts.log"
fi
