"""Traces recorded on the GPU machine (tests/replay/data/README.md says how): they follow the
schema, and they hold the outcomes of the real megatron.core that the model is compared with.
The plans were synthetic (replay/synthetic_plan.py), so the traces are compared with
themselves (resumed runs against the reference run), not element by element with the model."""

import copy
import json
import os

import pytest

from replay import compare
from replay import trace_schema as ts

from helpers import DATA

TRACES = sorted(n for n in os.listdir(DATA) if n.endswith(".trace.json"))


def load(prefix, contains=""):
    hits = [n for n in TRACES if n.startswith(prefix + "__") and contains in n]
    assert len(hits) == 1, (prefix, contains, hits)
    with open(os.path.join(DATA, hits[0])) as f:
        return json.load(f)


def run(t, rid):
    return next(r for r in t["runs"] if r["id"] == rid)


def errors(r):
    return sorted((e for e in r["events"] if e["at"] == "error"), key=lambda e: e["rank"])


@pytest.mark.parametrize("name", TRACES)
def test_recorded_traces_follow_the_schema(name):
    with open(os.path.join(DATA, name)) as f:
        t = json.load(f)
    assert ts.validate_trace(t) == []
    assert t["source"] == "real" and t["plan"]["synthetic"] is True
    for rev, info in t["megatron"].items():
        assert info["commit_source"] == "stamp" and len(info["commit"]) == 40


def test_bug2_step_reset_on_real_megatron_gloo_one_gpu():
    t = load("bug2-step-reset-dp2-to-4", "te-emulated")
    assert t["megatron"]["upstream-2874"]["commit"].startswith("f4502eb1c9")
    s = t["setup"]
    assert (s["backend"], s["gpus"], s["coalescing_workaround"], s["te"]) == ("gloo", 1, True, "emulated")
    ph1 = run(t, "phase1")
    assert ph1["dp"] == 4 and ph1["status"] == "completed"
    loads = [e for e in ph1["events"] if e["at"] == "after_load"]
    assert len(loads) == 4 and all(e["global_step"] == 5 for e in loads)
    assert {(p["part"], p["step"]) for e in loads for p in e["parts"]} == {("HDO cpu AdamW", 1.0)}
    for e in ph1["events"]:
        if e["at"] == "after_step":
            assert {p["step"] for p in e["parts"]} == {e["global_step"] - 4.0}
            assert {p["step_used"] for p in e["parts"]} == {e["global_step"] - 4.0}
    # The uninterrupted run holds the global step, and the phase saved 5.
    for e in run(t, "reference")["events"]:
        if e["at"] == "after_step":
            assert {p["step"] for p in e["parts"]} == {float(e["global_step"])}
    assert {p["step"] for e in run(t, "phase0")["events"] if e["at"] == "at_save" for p in e["parts"]} == {5.0}
    # The load restores the params exactly; the restarted bias correction then moves them.
    ev = compare.events_by_key(t)
    assert ev[("phase1", 0, "after_load", 5)]["hashes"]["model_param"] == \
        ev[("reference", 0, "after_step", 5)]["hashes"]["model_param"]
    assert [d["global_step"] for d in compare.model_param_divergence(t)] == [6, 7, 8]


@pytest.mark.parametrize("backend", ["h200x1", "h200x2"])
def test_bug1_duplicate_leaf_on_real_megatron(backend):
    t = load("bug1-duplicate-leaf-dp2-to-2", backend)
    assert t["megatron"]["miles-main"]["commit"].startswith("2e64d788b")
    assert run(t, "phase0")["status"] == "completed"
    ph1 = run(t, "phase1")
    assert ph1["status"] == "failed" and ph1["revision"] == "upstream-2874"
    e0, e1 = errors(ph1)
    assert (e0["rank"], e0["stage"], e0["py_type"], e0["merge_kind"]) == (0, "load", "ValueError", "duplicate_leaf")
    assert e0["merge_path"] == ["'optimizer'", "'param_state'", "0", "(torch.bfloat16, torch.float32)", "0", "0",
                                "'step'"]
    assert "`5.0` and `1.0`" in e0["message"]
    assert e0["site"] == "dict_utils.py merge()" and e0["site_line"].endswith("dict_utils.py:237")
    assert (e1["rank"], e1["merge_kind"]) == (1, "list_length_mismatch")
    assert "(3 and 1," in e1["message"]


def test_hybrid_without_te_cannot_be_configured_at_f4502eb1c9():
    t = load("bug2-step-reset-dp2-to-4", "te-absent")
    ref = run(t, "reference")
    e = errors(ref)[0]
    assert (e["stage"], e["py_type"], e["site"]) == ("init", "TypeError", "utils.py is_te_min_version()")
    assert run(t, "phase1")["status"] == "skipped"


def test_hybrid_without_te_fails_the_load_at_d98e8a64dd():
    t = load("bug2-at-upstream-head-dp2-to-2", "te-absent")
    assert run(t, "phase0")["status"] == "completed"
    e = errors(run(t, "phase1"))
    assert [(x["stage"], x["py_type"], x["site_line"]) for x in e] == [
        ("load", "AssertionError", "megatron/core/optimizer/distrib_optimizer.py:839")] * 2


def test_torch_adamw_resume_asserts():
    t = load("torch-adamw-resume-asserts")
    e = errors(run(t, "phase1"))
    assert [(x["stage"], x["py_type"], x["site"], x["site_line"]) for x in e] == [
        ("load", "AssertionError", "distrib_optimizer.py state_dict()",
         "megatron/core/optimizer/distrib_optimizer.py:642")] * 2


def test_fp32_params_fail_when_the_hybrid_is_built():
    t = load("hdo-fp32-params-keyerror")
    e = errors(run(t, "phase0"))[0]
    assert (e["stage"], e["py_type"], e["message"]) == ("init", "ValueError", "can't optimize a non-leaf Tensor")
    assert e["site"] == "hybrid_optimizer.py __init__()"


def test_pre_2874_save_asserts_on_the_step():
    t = load("pre2874-save-asserts-on-step")
    assert t["megatron"]["upstream-pre-2874"]["commit"].startswith("dceb1fb7ce")
    e = errors(run(t, "phase0"))
    assert e[0]["stage"] == "save" and e[0]["py_type"] == "AssertionError"
    assert e[0]["message"] == "(torch.Size([]), 0, 200)"


def test_offload_half_freezes_the_gpu_part_and_resets_the_cpu_part():
    t = load("spec17-J-lno-lno-offload-half")
    ph1 = run(t, "phase1")
    steps = {(e["at"], e["global_step"], p["part"]): p["step"] for e in ph1["events"] if e["at"] != "error"
             for p in e["parts"]}
    assert steps[("after_load", 5, "HDO cpu AdamW")] == 1.0
    assert steps[("after_load", 5, "HDO gpu FusedAdam")] == 5
    assert [steps[("after_step", g, "HDO gpu FusedAdam")] for g in (6, 7, 8, 9)] == [6, 6, 6, 6]
    assert [steps[("after_step", g, "HDO cpu AdamW")] for g in (6, 7, 8, 9)] == [2.0, 3.0, 4.0, 5.0]


def test_graft_resets_and_miles_main_restores():
    graft = load("bug2-at-pr69-graft-dp2-to-2")
    miles = load("bug2-at-miles-main-dp2-to-2")
    for t, want in ((graft, 1.0), (miles, 5.0)):
        loads = [e for e in run(t, "phase1")["events"] if e["at"] == "after_load"]
        assert {p["step"] for e in loads for p in e["parts"]} == {want}
    assert compare.model_param_divergence(miles) == []


def test_miles_main_offload_half_list_lengths():
    t = load("spec17-G-raw-raw-offload-half")
    e = errors(run(t, "phase1"))[0]
    assert e["merge_kind"] == "list_length_mismatch" and "(3 and 5," in e["message"]
    assert e["site_line"] == "megatron/core/dist_checkpointing/dict_utils.py:250"


def test_fused_adam_standin_resumes_bitwise():
    t = load("fused-adam-upstream-dp2-to-4")
    assert t["setup"]["fused_adam_standin"] is True and run(t, "phase1")["fused_adam_standin"] is True
    assert compare.step_expectations(t) == []
    assert compare.model_param_divergence(t) == []


def test_mutated_recorded_traces_diverge():
    t = load("bug2-step-reset-dp2-to-4", "te-emulated")
    kept = copy.deepcopy(t)
    for e in run(kept, "phase1")["events"]:
        for p in e["parts"]:
            if e["at"] == "after_load":
                p["step"] = 5.0
    d = compare.first_divergence(t, kept)
    assert d["run"] == "phase1" and d["at"] == "after_load" and (d["a"], d["b"]) == (1.0, 5.0)
    b1 = load("bug1-duplicate-leaf-dp2-to-2", "h200x1")
    no_error = copy.deepcopy(b1)
    r = run(no_error, "phase1")
    r["events"] = [e for e in r["events"] if e["rank"] != 0]
    assert compare.first_divergence(b1, no_error)["what"] == "errors"
