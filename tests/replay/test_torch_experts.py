"""The real replay of a MoE model (issue 26): a dense and an expert param, so that
get_megatron_optimizer() builds ChainedOptimizer([dense DistributedOptimizer, expert one]). Needs
torch, a CUDA device and the Megatron archives (`.megatron/` or CKPTSIM_MEGATRON_ROOT); skips
with the reason elsewhere. The torch-free parts (the EP arithmetic, the plan's rules, the
synthetic gradients, the trace's `chain`) are tested in test_model_parallel.py, test_plan.py,
test_synthetic_plan.py and test_trace_schema.py."""

import json

import pytest

from helpers import expert_scenario, gpu_megatron_root, real_replay, synthetic_of

torch = pytest.importorskip("torch", reason="torch is not installed (the torch-free parts are tested elsewhere)")

from replay import compare  # noqa: E402
from replay import model_parallel as mp  # noqa: E402

DENSE, EXPERT = "w0", "experts"
# Sizes at which every rank's shard of every bucket holds an element at DP 2 and 4, EP 1 and 2
# (helpers.expert_scenario's defaults leave a rank only padding: 'empty bucket encountered' at the
# first save, as the device run of 2026-12-05 showed). The model runs these sizes without error.
DENSE_NUMEL, EXPERT_SHAPE = 600, (8, 64)
EXPERT_NUMEL = EXPERT_SHAPE[0] * EXPERT_SHAPE[1]


def _scenario(**kw):
    return expert_scenario(dense=DENSE_NUMEL, expert_shape=EXPERT_SHAPE, **kw)


def _replay(tmp_path, sc):
    root = gpu_megatron_root(torch)
    return real_replay(tmp_path, "experts.plan.json", synthetic_of(sc), root, timeout=900)


def _state_events(run):
    return [e for e in run["events"] if e["at"] != "error"]


def _check_parts(run, ep):
    """Every part names its chain index (0 dense, 1 expert); each rank's expert shards lie in its
    EP piece; each event's shards tile the dense param over all ranks and each EP piece over its
    expert-DP group."""
    dp = run["dp"]
    by_point = {}
    for ev in _state_events(run):
        e = mp.expert_place(ev["rank"], 1, dp, ep)[0]
        piece = EXPERT_NUMEL // ep
        for p in ev["parts"]:
            assert p["chain"] == (1 if p["param"] == EXPERT else 0), p
            if p["param"] == EXPERT:
                assert e * piece <= p["range"][0] < p["range"][1] <= (e + 1) * piece, (ev["rank"], p)
        by_point.setdefault((ev["at"], ev["global_step"]), []).append(ev)
    for (at, gs), evs in by_point.items():
        if len(evs) != dp:
            continue
        dense = sorted(x for ev in evs for p in ev["parts"] if p["param"] == DENSE
                       for x in range(p["range"][0], p["range"][1]))
        assert dense == list(range(DENSE_NUMEL)), (at, gs)
        expert = sorted(x for ev in evs for p in ev["parts"] if p["param"] == EXPERT
                        for x in range(p["range"][0], p["range"][1]))
        assert expert == list(range(EXPERT_NUMEL)), (at, gs)


def _model_params_follow_the_reference(t, runs, ep):
    """Each rank's model params (its EP piece of the expert param, the whole dense param) hash as
    those of the reference rank of the same EP rank at the same global step (bit-equal: the
    synthetic gradients are dyadic and reduce exactly at any DP)."""
    # The reference run's rank e is EP rank e (EP divides its DP size).
    ref = {(e["rank"], e["global_step"]): e for e in runs["reference"]["events"] if e["at"] == "after_step"}
    for rid in ("phase0", "phase1"):
        run = runs[rid]
        for ev in run["events"]:
            if ev["at"] != "after_step":
                continue
            e = mp.expert_place(ev["rank"], 1, run["dp"], ep)[0]
            same = ref[e, ev["global_step"]]
            assert ev["hashes"]["model_param"] == same["hashes"]["model_param"], (rid, ev["rank"], ev["global_step"])
    assert compare.model_param_divergence(t) == []


@pytest.mark.gpu
@pytest.mark.parametrize("ep", [2, 1])
def test_real_replay_of_a_chained_optimizer_dp2_to_4(tmp_path, ep):
    """DP 2 -> 4 at upstream-2874 with FusedAdam (the stand-in): EP 2 reshards the expert part
    from expert DP 1 to 2 (EP 1: the synthetic marking, expert DP 2 to 4); both parts resume at
    the global step, and the model params stay bit-equal to the uninterrupted run's."""
    t, runs = _replay(tmp_path, _scenario(ep=ep, dps=(2, 4)))
    for rid in ("reference", "phase0", "phase1"):
        assert runs[rid]["status"] == "completed", json.dumps(runs[rid]["events"][-1])[:2000]
        _check_parts(runs[rid], ep)
    loads = [e for e in runs["phase1"]["events"] if e["at"] == "after_load"]
    assert len(loads) == 4 and all(p["step"] == 3 for e in loads for p in e["parts"])
    assert compare.step_expectations(t) == []
    _model_params_follow_the_reference(t, runs, ep)
    adaptations = "\n".join(t["setup"]["adaptations"])
    assert "allreduce=False set before DistributedDataParallel" in adaptations
    assert ("EP 1 with expert params: the marking is synthetic" in adaptations) == (ep == 1)


@pytest.mark.gpu
@pytest.mark.parametrize("revision", ["upstream-head", "miles-main"])
def test_real_replay_of_a_chained_optimizer_at_other_revisions(tmp_path, revision):
    """The same model at HEAD and miles-main: the runner builds, trains and saves both parts
    (phase 0 completes, every part names its chain index); what the resume does is the real
    code's outcome (any error a Megatron error, never the runner's)."""
    t, runs = _replay(tmp_path, _scenario(ep=2, dps=(2, 4), revision=revision))
    assert runs["phase0"]["status"] == "completed", json.dumps(runs["phase0"]["events"][-1])[:2000]
    _check_parts(runs["phase0"], 2)
    for run in t["runs"]:
        for ev in run["events"]:
            assert ev.get("py_type") != "ReplayRunnerError", json.dumps(ev)[:2000]
