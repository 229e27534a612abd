trainlab ops bench --device cuda --batch 4096 --impl triton --budget 0.3 --out ops_bench
