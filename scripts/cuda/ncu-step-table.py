"""The per-kernel GPU time of one training step from Nsight Compute's CSV (scripts/cuda/ncu-kernels.sh, part "step"):
ncu serializes the kernels and times each alone (gpu__time_duration), so the table holds no host gaps and no profiler
events between launches (the per-op CUDA-event profiler's over-reporting of some cuBLAS GEMMs does not arise). The step
is the launches after the second-to-last `adamw` kernel up to the last one (the last of the job's steps). Rows group
kernels by name and grid; a cuBLAS kernel is named by the shape that launched it where consecutive launches share it.
Usage: python3 scripts/cuda/ncu-step-table.py ncu-step.csv"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
# the program's own output comes first: the table starts at ncu's header row
start = next(i for i, r in enumerate(rows) if r[:2] == ["ID", "Process ID"])
hdr, data = rows[start], [r for r in rows[start + 2:] if len(r) == len(rows[start])]
ki, ti, gi = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum"), hdr.index("Grid Size")
opt = [i for i, r in enumerate(data) if r[ki].startswith("adamw")]
if len(opt) < 2:
    sys.exit(f"fewer than two optimizer launches in {sys.argv[1]}: {len(opt)}")
step = data[opt[-2] + 1: opt[-1] + 1]
agg = collections.OrderedDict()
total = 0.0
for r in step:
    us = float(r[ti].replace(",", "")) / 1e3
    key = (r[ki][:64], r[gi])
    a = agg.setdefault(key, [0, 0.0])
    a[0] += 1
    a[1] += us
    total += us
print(f"one training step: {len(step)} kernels, GPU time {total / 1e3:.2f} ms (sum of kernel durations, each alone)")
print(f"{'kernel':64s} {'grid':>16s} {'calls':>6s} {'ms':>8s} {'%':>6s} {'us/call':>8s}")
for (name, grid), (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:64s} {grid:>16s} {c:6d} {us / 1e3:8.2f} {100 * us / total:6.1f} {us / c:8.1f}")
