#!/usr/bin/env python3
"""GPU time per kernel from an Nsight Compute CSV log, summed by kernel name and grid.

Input: the log of
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base \
      --print-kernel-base function --log-file LOG qtts bench-decoder --streams S --chunks N --profile ...
(or any other profiled window). Each kernel ran alone under the profiler, so the total is an upper
bound of the window's GPU time; the ranking is what this is for. Usage: tools/ncu_kernels.py LOG [TOP]
"""
import sys
from collections import OrderedDict

from ncu_step import read_kernels


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    kernels = read_kernels(sys.argv[1])
    if not kernels:
        sys.exit("no kernel timings in " + sys.argv[1])
    by_kind = OrderedDict()
    for name, grid, us in kernels:
        entry = by_kind.setdefault((name, grid), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    total = sum(us for _, _, us in kernels)
    print(f"{len(kernels)} kernels, {total:.1f} us in all; the {top} largest (name, grid):")
    print(f"  {'us':>9} {'share':>6} {'count':>5}  kernel")
    for (name, grid), (count, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {us:9.1f} {100 * us / total:5.1f}% {count:5d}  {name} {grid}")


if __name__ == "__main__":
    main()
