#!/usr/bin/env bash
# device call 1 (2026-11-28 session 8): issue 40's time to 99 %, the layer profile, the graph tests
set -u
export TRAINLAB_CACHE=$PWD/.lab/cache TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD/src
O=/tmp/o; mkdir -p $O
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,triton,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,triton.__version__,torch.backends.cudnn.version())"
  nproc; cat /proc/loadavg; } > $O/machine.txt 2>&1
T0=$SECONDS
S=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19
echo "python3 benchmarks/lenet_time_to_99.py --device cuda --loops fast,fast=fast-muon,fast=fast-adamw,seed-style --seeds $S --baseline-seeds 0,1 --max-epochs 8 --out t99" > $O/t99.cmd
timeout 190 python3 benchmarks/lenet_time_to_99.py --device cuda --loops fast,fast=fast-muon,fast=fast-adamw,seed-style \
  --seeds $S --baseline-seeds 0,1 --max-epochs 8 --out $O/t99 --force > $O/t99.console 2>&1
echo "t99 rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt
tar czf $OUT/part1.tgz -C $O .
timeout 200 python3 benchmarks/gpu_layer_profile.py --out $O/profile --untuned --launch --impls aten,triton --runs 20 --queued 30 > $O/profile.console 2>&1
echo "profile rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt
tar czf $OUT/part2.tgz -C $O .
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lenet_step.py > $O/graph_check.console 2>&1
echo "graph_check rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt
tar czf $OUT/all.tgz -C $O .
tail -3 $O/graph_check.console; tail -25 $O/t99.console; tail -8 $O/profile.console
