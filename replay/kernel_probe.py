"""`python -m replay.kernel_probe`: what torch's own AdamW kernels compute, element by element.

Runs torch.optim.AdamW, as Megatron builds it, on a few params of awkward sizes for a few steps
and records every input (initial params, every step's gradients, lr and weight decay) and every
output (params, exp_avg, exp_avg_sq after each step) as float32 bits, for the three kernels a
Megatron job without Transformer Engine runs:

(named in the output as the traces name them: torch_foreach_cuda, torch_fused_cpu, ...)
  foreach_cuda   torch.optim.AdamW(...) on CUDA params (foreach=None: torch picks
                 _multi_tensor_adam), the distributed optimizer's inner optimizer without TE
  fused_cpu      torch.optim.AdamW(..., fused=True) on CPU params: the HybridDeviceOptimizer's
                 CPU part (aten/src/ATen/native/cpu/FusedAdamKernel.cpp)
  fused_cuda     torch.optim.AdamW(..., fused=True) on CUDA params: the HDO's GPU part when TE is
                 absent (aten/src/ATen/native/cuda/fused_adam_*.cu)

ckptsim's tests (tests/model/kernels/torch_adamw_kernels_test.cpp) replay the inputs through the
model's kernels and require the same bits. The output is one JSON file:

  {"format": "ckptsim-kernel-probe", "version": 1, "torch": "...", "cpu_capability": "AVX512",
   "device_name": "...", "cases": [{"kernel", "sizes", "betas", "eps", "steps": [{"lr", "wd"}],
   "init": b64, "grads": [b64 per step], "param": [b64 per step], "exp_avg": [...],
   "exp_avg_sq": [...], "step": [float per step]}]}

Every array is every param's values concatenated in order (base64 little-endian float32).
Inputs are drawn from a fixed seed: the file is the same on every run of the same torch build.

`python -m replay.kernel_probe trim PROBE.json... --out FIXTURE.json` (torch-free) cuts probe
files to the committed test fixture (see trim()).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from .trace_schema import encode_f32 as f32_b64

# Sizes: every tail length of a 16- and an 8-wide vector loop, both sides of one and two
# vectors, one parallel_for task unit (16 floats) and many.
SIZES_SMALL = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 47, 63, 64, 65]
SIZES_LARGE = [127, 129, 1000, 2053]

# (betas, eps, [(lr, wd) per step]): the generators' hyper-parameters (lr 0.01, betas 0.9/0.95,
# eps 1e-8, wd 0.1), a schedule that moves lr and wd every step, wd 0 (the kernels skip the
# decay), torch's defaults, and beta1 below 0.5 (lerp's other branch).
def hyper_sets(steps: int) -> List[Dict[str, Any]]:
    moving = [(0.01 * (1.0 - 0.07 * (k % 10)), 0.1 * (0.5 + 0.1 * (k % 10))) for k in range(steps)]
    return [
        {"betas": (0.9, 0.95), "eps": 1e-8, "sched": [(0.01, 0.1)] * steps},
        {"betas": (0.9, 0.95), "eps": 1e-8, "sched": moving},
        {"betas": (0.9, 0.95), "eps": 1e-8, "sched": [(0.005, 0.0)] * steps},
        {"betas": (0.9, 0.999), "eps": 1e-8, "sched": [(0.001, 0.01)] * steps},
        {"betas": (0.4, 0.95), "eps": 1e-6, "sched": [(0.02, 0.05)] * steps},
    ]


def bf16_exact(rng, n: int):
    """Values exact in bf16 (ckptsim's initial params are), some of them 0."""
    import numpy as np

    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
    bits = x.view(np.uint32) & np.uint32(0xFFFF0000)
    out = bits.view(np.float32).copy()
    out[rng.random(n) < 0.03] = 0.0
    return out


def grads(rng, n: int):
    """Dyadic-ish gradients of mixed magnitude (ckptsim's are exact sums of bf16 values over
    samples_per_step), with zeros and a few tiny and large ones."""
    import numpy as np

    g = bf16_exact(rng, n) / np.float32(8.0)
    r = rng.random(n)
    g[r < 0.02] *= np.float32(2.0 ** -20)
    g[(r >= 0.02) & (r < 0.04)] *= np.float32(64.0)
    g[(r >= 0.04) & (r < 0.06)] = 0.0
    return g


def run_case(torch, kernel: str, sizes: List[int], hyper: Dict[str, Any], seed: int) -> Dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    total = sum(sizes)
    init = bf16_exact(rng, total)
    sched = hyper["sched"]
    all_grads = [grads(rng, total) for _ in sched]
    device = "cpu" if kernel == "fused_cpu" else "cuda"
    kwargs: Dict[str, Any] = {}
    if kernel.startswith("fused"):
        kwargs["fused"] = True
    params = []
    off = 0
    for n in sizes:
        params.append(torch.nn.Parameter(torch.from_numpy(init[off:off + n].copy()).to(device)))
        off += n
    opt = torch.optim.AdamW(params, lr=sched[0][0], betas=hyper["betas"], eps=hyper["eps"],
                            weight_decay=sched[0][1], **kwargs)
    out: Dict[str, Any] = {"kernel": "torch_" + kernel, "sizes": sizes, "betas": list(hyper["betas"]),
                           "eps": hyper["eps"], "steps": [], "init": f32_b64(init), "grads": [],
                           "param": [], "exp_avg": [], "exp_avg_sq": [], "step": []}

    def cat(get):
        return np.concatenate([get(p).detach().float().cpu().numpy().reshape(-1) for p in params])

    for k, (lr, wd) in enumerate(sched):
        for g in opt.param_groups:
            g["lr"] = lr
            g["weight_decay"] = wd
        off = 0
        for p, n in zip(params, sizes):
            p.grad = torch.from_numpy(all_grads[k][off:off + n].copy()).to(device)
            off += n
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        out["steps"].append({"lr": lr, "wd": wd})
        out["grads"].append(f32_b64(all_grads[k]))
        out["param"].append(f32_b64(cat(lambda p: p)))
        out["exp_avg"].append(f32_b64(cat(lambda p: opt.state[p]["exp_avg"])))
        out["exp_avg_sq"].append(f32_b64(cat(lambda p: opt.state[p]["exp_avg_sq"])))
        out["step"].append(float(opt.state[params[0]]["step"]))
    return out


def trim(doc: Dict[str, Any], sizes_max: int, steps_per_case: int, long_keep: int,
         long_first: int = 0) -> Dict[str, Any]:
    """The test fixture (tests/model/kernels/data/): every case cut to its params of at most
    `sizes_max` elements (whole params: torch's fused CPU kernel rounds a tensor's last
    numel % 8 elements apart) and its first `steps_per_case` steps; a case longer than that
    keeps its first and last `long_keep` steps. A kept step whose previous step is not kept
    carries the state it started from ("before": that step's outputs, or the initial params and
    zero moments); the others start from the previous step's "after". Torch-free."""
    import base64
    from array import array

    def floats(text: str) -> List[float]:
        a = array("f")
        a.frombytes(base64.b64decode(text))
        return list(a)

    out = {k: v for k, v in doc.items() if k != "cases"}
    out["format"] = "ckptsim-kernel-fixture"
    out["cases"] = []
    for c in doc["cases"]:
        keep, off = [], 0
        for n in c["sizes"]:
            if n <= sizes_max:
                keep.append((off, n))
            off += n

        def cut(text: str) -> str:
            xs = floats(text)
            return f32_b64([x for (o, n) in keep for x in xs[o:o + n]])

        nsteps = len(c["steps"])
        if nsteps > 2 * long_keep + steps_per_case:  # a long case: its first and last steps
            idx = list(range(max(long_keep, long_first))) + list(range(nsteps - long_keep, nsteps))
        else:
            idx = list(range(min(nsteps, steps_per_case)))
        steps = []
        for j, k in enumerate(idx):
            step = {"lr": c["steps"][k]["lr"], "wd": c["steps"][k]["wd"], "t": c["step"][k],
                    "grad": cut(c["grads"][k])}
            if k == 0:
                zeros = f32_b64([0.0] * sum(n for _, n in keep))
                step["before"] = {"param": cut(c["init"]), "exp_avg": zeros, "exp_avg_sq": zeros}
            elif j == 0 or idx[j - 1] != k - 1:
                step["before"] = {f: cut(c[f][k - 1]) for f in ("param", "exp_avg", "exp_avg_sq")}
            step["after"] = {f: cut(c[f][k]) for f in ("param", "exp_avg", "exp_avg_sq")}
            steps.append(step)
        name = c["kernel"] if c["kernel"].startswith("torch_") else "torch_" + c["kernel"]
        out["cases"].append({"kernel": name, "sizes": [n for _, n in keep], "betas": c["betas"],
                             "eps": c["eps"], "steps": steps})
    return out


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "trim":
        tp = argparse.ArgumentParser(prog="python -m replay.kernel_probe trim")
        tp.add_argument("inputs", nargs="+")
        tp.add_argument("--out", required=True)
        tp.add_argument("--sizes-max", type=int, default=65)
        tp.add_argument("--steps", type=int, default=3)
        tp.add_argument("--long-keep", type=int, default=4)
        tp.add_argument("--long-first", type=int, default=0, help="keep this many first steps of a long case")
        t = tp.parse_args(argv[1:])
        merged: Dict[str, Any] = {}
        for path in t.inputs:
            with open(path) as f:
                d = trim(json.load(f), t.sizes_max, t.steps, t.long_keep, t.long_first)
            cases = merged.get("cases", []) + d["cases"]
            merged = dict(d, cases=cases)
        with open(t.out, "w") as f:
            json.dump(merged, f, separators=(",", ":"))
        print("kernel_probe trim: %d cases -> %s" % (len(merged["cases"]), t.out))
        return 0
    ap = argparse.ArgumentParser(prog="python -m replay.kernel_probe", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--steps", type=int, default=5, help="steps of each case (default: %(default)s)")
    ap.add_argument("--long-steps", type=int, default=0,
                    help="also a case of this many steps on the small sizes (0: none)")
    ap.add_argument("--large", action="store_true", help="also the large sizes")
    ap.add_argument("--kernels", default="foreach_cuda,fused_cpu,fused_cuda")
    args = ap.parse_args(argv)

    import torch  # the one import that needs the GPU machine

    if not torch.cuda.is_available():
        print("kernel_probe: no CUDA device", file=sys.stderr)
        return 2
    sizes = SIZES_SMALL + (SIZES_LARGE if args.large else [])
    cases = []
    seed = 1
    for kernel in args.kernels.split(","):
        for hyper in hyper_sets(args.steps):
            cases.append(run_case(torch, kernel, sizes, hyper, seed))
            seed += 1
        if args.long_steps:
            long = hyper_sets(args.long_steps)[1]
            cases.append(run_case(torch, kernel, SIZES_SMALL, long, seed))
            seed += 1
    doc = {"format": "ckptsim-kernel-probe", "version": 1, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "device_name": torch.cuda.get_device_name(0), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(doc, f)
    print("kernel_probe: %d cases, torch %s, cpu %s -> %s" % (len(cases), doc["torch"], doc["cpu_capability"], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
