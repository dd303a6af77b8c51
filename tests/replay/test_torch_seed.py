"""The runner seeds the generators as Megatron's training loop does (RankRun._seed), so that what
draws from them draws the same in every run of a plan. HDO.dummy_step() gives every param a
torch.randn_like gradient at a load; where the load then leaves the master as the dummy step made
it (a hybrid over dp_zero_gather_scatter at 2874: campaign-issue26's seed86-case3), the trace's
master after the load rests on those draws. Two replays of one scenario in one runner (whose
worker processes outlive a plan) must then hold the same master. Needs torch, a CUDA device and
the Megatron archives; skips with the reason elsewhere."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, gpu_megatron_root, synthetic_of, write_json

torch = pytest.importorskip("torch", reason="torch is not installed (the torch-free parts are tested elsewhere)")

SCENARIO = {
    "name": "hybrid-dummy-step", "seed": 1, "bucket_size": None, "sharding_type": "dp_zero_gather_scatter",
    "params": [{"name": "p0", "numel": 203, "dtype": "bf16"}],
    "optimizer": {"kind": "hybrid", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1,
                  "offload_fraction": 0.5, "exp_avg_sq_dtype": "fp16"},
    "phases": [{"dp": 1, "revision": "upstream-2874", "steps": 1},
               {"dp": 1, "revision": "upstream-2874", "steps": 1, "opt_param_scheduler": "override"}],
}


def _event(trace, run_id, at):
    run = next(r for r in trace["runs"] if r["id"] == run_id)
    return next(e for e in run["events"] if e["at"] == at and e["rank"] == 0)


def test_two_replays_in_one_runner_draw_the_same_dummy_step(tmp_path):
    root = gpu_megatron_root(torch)
    plans = tmp_path / "plans"
    plans.mkdir()
    for name in ("first", "second"):
        sc = dict(SCENARIO, name="hybrid-dummy-step-" + name)
        write_json(plans, sc["name"] + ".plan.json", synthetic_of(sc))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "replay", "run", "--plan", str(plans), "--megatron-root", root,
                        "--out-dir", str(out), "--emulate-te", "--fused-adam-standin",
                        "--work-dir", str(tmp_path / "w")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    traces = {}
    for name in ("first", "second"):
        with open(os.path.join(str(out), "hybrid-dummy-step-%s.trace.json" % name)) as f:
            traces[name] = json.load(f)
        if traces[name]["runs"][1]["status"] == "skipped":
            pytest.skip("the plan's checkout is not under %s" % root)
    first, second = traces["first"], traces["second"]
    # The premise: the load leaves the master as the dummy step made it (not as phase 0 saved it).
    saved = _event(first, "phase0", "at_save")["hashes"]["master"]["p0"]
    loaded = _event(first, "phase1", "after_load")["hashes"]["master"]["p0"]
    assert loaded != saved, "the load restored the master: this scenario no longer shows the dummy step"
    assert _event(second, "phase1", "after_load")["hashes"]["master"]["p0"] == loaded
