#!/usr/bin/env bash
# The GPU checks of issues 5 and 6 as one prepared run (device time is scarce): proxy-150m
# tokens/s, MFU and the planner's memory estimate; then async-checkpoint blocking time and
# bandwidth for proxy-150m. Needs only the machine's torch and this repository.
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
