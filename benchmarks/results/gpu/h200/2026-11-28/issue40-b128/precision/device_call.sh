#!/usr/bin/env bash
# device call 4 (2026-11-28 session 8): the fast preset's step in fp32 and NCHW beside bf16 channels-last, 20 seeds
set -u
export TRAINLAB_CACHE=$PWD/.lab/cache TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD/src
O=/tmp/o; mkdir -p $O; T0=$SECONDS
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,triton,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,triton.__version__,torch.backends.cudnn.version())"; } > $O/machine.txt 2>&1
S=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19
L=fast,fast=fast-b128-fp32,fast=fast-b128-nchw,fast=fast-b128-fp32-nchw,seed-style
echo "python3 benchmarks/lenet_time_to_99.py --device cuda --loops $L --seeds $S --baseline-seeds 0 --max-epochs 8 --out t99" > $O/t99.cmd
timeout 185 python3 benchmarks/lenet_time_to_99.py --device cuda --loops $L --seeds $S --baseline-seeds 0 --max-epochs 8 --out $O/t99 --force > $O/t99.console 2>&1
echo "t99 rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt
tar czf $OUT/all.tgz -C $O .
grep -A8 "^| loop | threads" $O/t99/*.md; grep -A8 "^| loop | step mode" $O/t99/*.md
