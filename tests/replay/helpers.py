"""Shared helpers of the replay tests (torch-free)."""

import copy
import json
import os
import subprocess
import sys

import pytest

from replay import synthetic_plan
from replay import trace_schema as ts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
FAKE_PYTHON = os.path.join(HERE, "fake_python")


def scenario(name):
    for sub in ("scenarios", os.path.join("scenarios", "found")):
        p = os.path.join(ROOT, sub, name + ".json")
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f), p
    raise FileNotFoundError(name)


def synthetic(name, **overrides):
    sc, path = scenario(name)
    sc = copy.deepcopy(sc)
    sc.update(overrides)
    profiles = synthetic_plan._load_profiles([os.path.join(ROOT, "revisions")])
    return synthetic_plan.build_plan(sc, path, profiles)


def expert_scenario(ep=2, dps=(2, 4), kind="fused_adam", revision="upstream-2874", steps=(3, 2), dense=40,
                    expert_shape=(8, 6)):
    """A small MoE scenario (issue 26): a dense param `w0` (`dense` elements) and an expert param
    `experts` (`expert_shape`, split over EP on dim 0), the same EP in every phase (not a bundled
    scenario file). The default sizes are too small for a real dp_reshardable save at DP 2 and up
    (a rank's shard of a bucket holds only padding: 'empty bucket encountered'); a real replay
    takes dense=600, expert_shape=(8, 64)."""
    return {"name": "expert-ep%d-dp%s" % (ep, "-to-".join(str(d) for d in dps)), "seed": 3,
            "params": [{"name": "w0", "numel": dense, "dtype": "bf16"},
                       {"name": "experts", "numel": expert_shape[0] * expert_shape[1], "shape": list(expert_shape),
                        "dtype": "bf16", "expert": True}],
            "optimizer": {"kind": kind, "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1},
            "bucket_size": None, "sharding_type": "dp_reshardable",
            "phases": [{"dp": d, "ep": ep, "revision": revision, "steps": n} for d, n in zip(dps, steps)]}


def synthetic_of(sc):
    """The synthetic plan of an inline scenario (revision profiles from revisions/)."""
    profiles = synthetic_plan._load_profiles([os.path.join(ROOT, "revisions")])
    return synthetic_plan.build_plan(copy.deepcopy(sc), sc["name"] + ".json", profiles)


def write_json(tmp_path, name, obj):
    p = os.path.join(str(tmp_path), name)
    with open(p, "w") as f:
        json.dump(obj, f)
    return p


def hashes_for(names, value=0.0):
    h = ts.hash_f32([value])
    return {k: {n: h for n in names} for k in ts.HASH_KINDS}


def minimal_trace():
    """A small valid trace: one reference run, one resumed run that fails at the load."""
    names = ["w0"]
    ev = lambda r, at, gs, step: {"rank": r, "at": at, "global_step": gs,  # noqa: E731
                                  "parts": [{"part": "HDO cpu AdamW", "param": "w0", "range": [r * 4, r * 4 + 4],
                                             "step": step, "step_used": step if at == "after_step" else None}],
                                  "hashes": hashes_for(names, float(gs))}
    return {
        "format": "ckptsim-trace", "version": 1, "source": "real",
        "megatron": {"upstream-2874": {"repo": "NVIDIA/Megatron-LM", "commit": "f4502eb1c9", "dir": "/x",
                                       "commit_source": "stamp"}},
        "setup": {"backend": "gloo", "gpus": 1, "coalescing_workaround": True, "te": "emulated",
                  "fused_adam_standin": False, "torch": "2.11.0", "hash": ts.HASH_NAME, "adaptations": []},
        "scenario": "tiny",
        "runs": [
            {"id": "reference", "dp": 2, "revision": "upstream-2874", "status": "completed",
             "events": [ev(0, "init", 0, None), ev(1, "init", 0, None), ev(0, "after_step", 1, 1.0),
                        ev(1, "after_step", 1, 1.0)]},
            {"id": "phase1", "dp": 2, "revision": "upstream-2874", "status": "failed", "load": True,
             "events": [
                 {"rank": 0, "at": "error", "stage": "load", "py_type": "ValueError", "message": "Duplicate",
                  "site": "dict_utils.py merge()", "site_line": "megatron/core/dist_checkpointing/dict_utils.py:237",
                  "merge_path": ["'optimizer'", "'step'"], "merge_kind": "duplicate_leaf", "secondary": False,
                  "global_step": 1},
                 ev(1, "after_load", 1, 1.0)]},
        ],
    }


def megatron_root():
    """The Megatron archives (replay/fetch-megatron.sh's .megatron/, or CKPTSIM_MEGATRON_ROOT),
    None where there are none."""
    root = os.environ.get("CKPTSIM_MEGATRON_ROOT", os.path.join(ROOT, ".megatron"))
    return root if os.path.isdir(root) else None


def gpu_megatron_root(torch):
    """The Megatron archives for a real replay; skips the test without a CUDA device or without
    archives."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the real replay runs on a GPU machine")
    root = megatron_root()
    if root is None:
        pytest.skip("no Megatron archives: run replay/fetch-megatron.sh or set CKPTSIM_MEGATRON_ROOT")
    return root


def real_replay(tmp_path, name, plan, root, timeout=600):
    """`python -m replay run` of the plan dict `plan` on the checkouts under `root`, TE emulated
    and the FusedAdam stand-in; (the trace, its runs by id), the trace valid. Skips where the
    plan's checkout is not under `root`."""
    path = write_json(tmp_path, name, plan)
    out = os.path.join(str(tmp_path), "t.json")
    r = subprocess.run([sys.executable, "-m", "replay", "run", "--plan", path, "--megatron-root", root, "--out", out,
                        "--emulate-te", "--fused-adam-standin", "--work-dir", os.path.join(str(tmp_path), "w")],
                       capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        t = json.load(f)
    assert ts.validate_trace(t) == []
    runs = {x["id"]: x for x in t["runs"]}
    if runs["phase0"]["status"] == "skipped" and "checkout" in runs["phase0"].get("skipped_reason", ""):
        pytest.skip("the plan's checkout is not under %s: %s" % (root, runs["phase0"]["skipped_reason"]))
    return t, runs
