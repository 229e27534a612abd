#!/usr/bin/env bash
# device call 3 (2026-11-28 session 8): the Triton rung after its changes (TF32 per torch's switches, no mask in the GEMMs)
set -u
export TRAINLAB_CACHE=$PWD/.lab/cache TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD/src:$PWD/.lab
O=/tmp/o; mkdir -p $O; T0=$SECONDS
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,triton,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,triton.__version__,torch.backends.cudnn.version())"; } > $O/machine.txt 2>&1
timeout 80 python3 benchmarks/gpu_layer_profile.py --out $O/profile --untuned --ieee --impls aten,triton --runs 20 --queued 30 > $O/profile.console 2>&1
echo "profile rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt; tar czf $OUT/part1.tgz -C $O .
timeout 130 python3 -m pytest -q -p no:cacheprovider -p untuned_plugin -m gpu tests/test_ops_layers_triton.py -x > $O/pytest_gpu.console 2>&1
echo "pytest rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt; tar czf $OUT/part2.tgz -C $O .
echo "trainlab ops bench --device cuda --batch 4096 --impl triton --budget 0.3 --out ops_bench" > $O/ops_bench.cmd
timeout 230 python3 -m trainlab ops bench --device cuda --batch 4096 --impl triton --budget 0.3 --out $O/ops_bench > $O/ops_bench.console 2>&1
echo "ops_bench rc=$? at $((SECONDS-T0)) s" | tee -a $O/times.txt
tar czf $OUT/all.tgz -C $O .
tail -3 $O/pytest_gpu.console; tail -8 $O/profile.console | grep -v USDT; tail -30 $O/ops_bench.console
