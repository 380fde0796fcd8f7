#!/usr/bin/env python3
"""Per-product GPU time of the batched frame step, from an Nsight Compute CSV log.

Input: the log of
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base \
      --print-kernel-base function --log-file LOG qtts bench --batch LIST --chunk 1 --batch-profile ...
(tools/gpu-run.sh with QTTS_PROFILE_BATCH), i.e. one replay of the one-frame step per bucket. Each
kernel ran alone under the profiler (no overlap with its neighbours), so the sums are an upper
bound of the step; the split between the roles is what this is for.

The step's kernel order (engine/cuda/gpu_batch.cpp): slots_load; 15 predictor passes, each
[input / projection] + layers x [qkv, attention, o, gate/up, down] + head, then a draw; the talker:
frame embed + layers x [...], RMSNorm, codec head, a draw; slots_store_hidden. A product is one
launch (gemv or the one-launch tensor-core kernel) or three (RMSNorm/split, cuBLAS GEMM, combine);
in a fused split pass (stack_split_pass) most splits are the previous product's combine
("combine+split"). Usage: tools/ncu_step.py LOG
"""
import csv
import sys
from collections import OrderedDict

OURS = {
    "attention_cached_batched_kernel", "attention_cached_kernel", "attention_kernel", "frame_embed_kernel",
    "gather_kernel", "gemv_vec_kernel", "kv_append_batched_kernel", "kv_append_kernel", "predictor_input_kernel",
    "rmsnorm_kernel", "rows_add_kernel", "sample_kernel", "skinny_kernel", "slots_load_kernel",
    "slots_store_hidden_kernel", "split_combine_kernel", "combine_rmsnorm_split_kernel",
}


def base(name):
    name = name.split("(")[0].split("<")[0].strip()
    return name.split("::")[-1].split(" ")[-1]


def read_kernels(path):
    """[(name, grid, us)] in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    out = []
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = ns / 1000.0 if unit in ("ns", "nsecond") else (ns * 1000.0 if unit in ("us", "usecond") else ns / 1000.0)
        out.append((base(r["Kernel Name"]), r.get("Grid Size", ""), us))
    return out


def units_of(kernels):
    """Groups the kernels into products and single kernels: [(kind, name, [(part, us)])]. A split
    product is [its split (rmsnorm_kernel)] + cuBLAS kernels + [its combine]; in a fused pass
    (stack_split_pass) the split of most products is the previous product's combine."""
    units, i, n = [], 0, len(kernels)
    while i < n:
        name, _, us = kernels[i]
        starts_split = name == "rmsnorm_kernel" and i + 1 < n and kernels[i + 1][0] not in OURS
        if starts_split or name not in OURS:
            parts = []
            if starts_split:
                parts.append(("split", us))
                i += 1
            while i < n and kernels[i][0] not in OURS:
                parts.append(("gemm", kernels[i][2]))
                i += 1
            if i < n and kernels[i][0] in ("split_combine_kernel", "combine_rmsnorm_split_kernel"):
                fused = kernels[i][0] == "combine_rmsnorm_split_kernel"
                parts.append(("combine+split" if fused else "combine", kernels[i][2]))
                i += 1
            units.append(("product", "split", parts))
        elif name in ("gemv_vec_kernel", "skinny_kernel"):
            units.append(("product", name.replace("_kernel", "").replace("_vec", ""), [(name, us)]))
            i += 1
        else:
            units.append(("kernel", name, [(name, us)]))
            i += 1
    return units


def label_segment(units, talker, first):
    """Role of each unit of one pass (the units up to and including its draw); the predictor's first
    pass (two rows a stream) is labelled apart."""
    products = [k for k, u in enumerate(units) if u[0] == "product"]
    layers = sum(1 for u in units if u[0] == "kernel" and "attention" in u[1])
    roles = {}
    stack = products[:]
    prefix = "talker" if talker else ("predictor pass 1" if first else "predictor")
    if stack:
        roles[stack.pop()] = f"{prefix} {'codec head' if talker else 'head'}"
    if not talker and len(stack) == 4 * layers + 1:
        roles[stack.pop(0)] = f"{prefix} projection"
    names = ["qkv", "o", "gate/up", "down"]
    for k, idx in enumerate(stack):
        roles[idx] = f"{prefix} {names[k % 4]}"
    labels = []
    for k, u in enumerate(units):
        if k in roles:
            labels.append(roles[k])
        elif "attention" in u[1]:
            labels.append(f"{prefix} attention")
        elif u[1] == "sample_kernel":
            labels.append("sample")
        else:
            labels.append(u[1].replace("_kernel", ""))
    return labels


def report(step, rows):
    units = units_of(step)
    segments, current = [], []
    for u in units:
        current.append(u)
        if u[1] == "sample_kernel":
            segments.append(current)
            current = []
    if current and segments:
        segments[-1].extend(current)  # slots_store_hidden after the talker's draw
    elif current:
        segments.append(current)
    table = OrderedDict()
    for s, seg in enumerate(segments):
        talker = s == len(segments) - 1
        for u, label in zip(seg, label_segment(seg, talker, s == 0)):
            row = table.setdefault(label, {"launches": 0, "count": 0, "us": 0.0, "parts": OrderedDict(), "path": set()})
            row["count"] += 1
            row["launches"] += len(u[2])
            row["path"].add(u[1] if u[0] == "product" else "")
            for part, us in u[2]:
                row["us"] += us
                row["parts"][part] = row["parts"].get(part, 0.0) + us
    total = sum(r["us"] for r in table.values())
    launches = sum(r["launches"] for r in table.values())
    print(f"\n  batched step, {rows} rows: {launches} launches, {total / 1000.0:.3f} ms of kernels run alone (ncu)")
    print(f"  {'role':<24} {'path':<8} {'count':>6} {'launches':>8} {'us/frame':>10} {'us each':>9} {'share':>6}  split/gemm/combine/combine+split us")
    for label, r in sorted(table.items(), key=lambda kv: -kv[1]["us"]):
        parts = r["parts"]
        detail = ""
        if "gemm" in parts:
            detail = "/".join(f"{parts.get(p, 0.0):.0f}" for p in ("split", "gemm", "combine", "combine+split"))
        path = ",".join(sorted(p for p in r["path"] if p))
        print(f"  {label:<24} {path:<8} {r['count']:>6} {r['launches']:>8} {r['us']:>10.1f} {r['us'] / r['count']:>9.2f} "
              f"{100.0 * r['us'] / total:>5.1f}%  {detail}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    kernels = read_kernels(sys.argv[1])
    if not kernels:
        print("ncu_step.py: no kernel times in", sys.argv[1])
        return 1
    # One step per profiled replay: from a slots_load to the next slots_store_hidden.
    step = None
    for name, grid, us in kernels:
        if name == "slots_load_kernel":
            step = [(name, grid, us)]
            continue
        if step is None:
            continue
        step.append((name, grid, us))
        if name == "slots_store_hidden_kernel":
            rows = grid.strip("()").split(",")[0].strip() if grid else "?"
            report(step, rows)
            step = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
