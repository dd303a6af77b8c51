"""The coordinator's decisions, and whole `python -m replay run` invocations against the fake
worker (tests/replay/fake_worker.py speaks the worker protocol without torch or Megatron)."""

import json
import os
import subprocess
import sys

import pytest

from replay import coordinator as cd
from replay import plan as plan_mod
from replay import trace_schema as ts

from helpers import FAKE_PYTHON, ROOT, synthetic, write_json


@pytest.mark.parametrize("kind,needs,te,emu,standin,want", [
    ("hybrid", False, False, False, False, ("absent", False, None)),
    ("hybrid", False, False, True, True, ("absent", False, None)),  # the scenario wins over --emulate-te
    ("hybrid", True, False, True, False, ("emulated", False, None)),
    ("hybrid", True, False, True, True, ("emulated", True, None)),
    ("hybrid", True, True, True, True, ("real", False, None)),
    ("torch_adamw", False, False, True, True, ("absent", False, None)),
    ("fused_adam", True, True, False, False, ("real", False, None)),
])
def test_te_decision(kind, needs, te, emu, standin, want):
    assert cd.te_decision(kind, needs, te, emu, standin) == want


def test_te_decision_skips():
    assert "TE is not installed" in cd.te_decision("fused_adam", True, False, True, False)[2]
    assert "TE is not installed" in cd.te_decision("fused_adam", True, False, False, True)[2]
    assert "fallback" in cd.te_decision("torch_adamw", False, True, False, False)[2]
    assert "transformer_engine" in cd.te_decision("hybrid", False, True, True, True)[2]
    # a hybrid that has TE is never replayed without it by accident
    assert "--emulate-te" in cd.te_decision("hybrid", True, False, False, False)[2]


@pytest.mark.parametrize("kind,te,want", [
    ("hybrid", None, True), ("hybrid", "installed", True), ("hybrid", "absent", False),
    ("fused_adam", None, True), ("torch_adamw", None, False),
])
def test_needs_te(kind, te, want):
    o = {"kind": kind}
    if te is not None:
        o["transformer_engine"] = te
    assert plan_mod.needs_te({"scenario": {"optimizer": o}}) is want


def test_backend_decision():
    assert cd.backend_decision("auto", 2, 2) == ("nccl", False, [0, 1], None)
    assert cd.backend_decision("auto", 4, 2) == ("gloo", True, [0, 1, 0, 1], None)
    assert cd.backend_decision("auto", 4, 1) == ("gloo", True, [0, 0, 0, 0], None)
    assert cd.backend_decision("gloo", 1, 8) == ("gloo", True, [0], None)
    assert cd.backend_decision("nccl", 3, 2)[3].startswith("--backend nccl needs one GPU per rank")
    assert cd.backend_decision("auto", 1, 0)[3] == "no CUDA device is visible to the workers"


def test_backend_decision_device_offset():
    # offset 0 is the old mapping
    for req, dp, gpus in [("auto", 2, 2), ("auto", 4, 2), ("gloo", 3, 8), ("nccl", 1, 1)]:
        assert cd.backend_decision(req, dp, gpus, 0) == cd.backend_decision(req, dp, gpus)
    assert cd.backend_decision("auto", 2, 4, 3) == ("nccl", False, [3, 0], None)
    assert cd.backend_decision("nccl", 4, 8, 6) == ("nccl", False, [6, 7, 0, 1], None)
    assert cd.backend_decision("auto", 4, 2, 1) == ("gloo", True, [1, 0, 1, 0], None)
    assert cd.backend_decision("gloo", 3, 8, 5) == ("gloo", True, [5, 6, 7], None)
    assert cd.backend_decision("auto", 1, 8, 13) == ("nccl", False, [5], None)
    # NCCL still gets one distinct GPU per rank, whatever the offset
    for gpus in range(1, 9):
        for dp in range(1, gpus + 1):
            for off in range(2 * gpus):
                backend, _, devices, why = cd.backend_decision("auto", dp, gpus, off)
                assert backend == "nccl" and why is None
                assert len(set(devices)) == dp and all(0 <= d < gpus for d in devices)
    assert cd.backend_decision("nccl", 3, 2, 1)[3].startswith("--backend nccl needs one GPU per rank")


def test_order_events_by_position_then_rank():
    per = {1: [{"r": 1, "i": 0}, {"r": 1, "i": 1}], 0: [{"r": 0, "i": 0}, {"r": 0, "i": 1}, {"r": 0, "i": 2}]}
    assert [(e["i"], e["r"]) for e in cd.order_events(per)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]


def test_peer_failure_heuristic():
    assert cd.looks_like_peer_failure({"py_type": "DistBackendError", "message": ""})
    assert cd.looks_like_peer_failure({"py_type": "RuntimeError", "message": "[gloo] Connection closed by peer"})
    assert not cd.looks_like_peer_failure({"py_type": "ValueError", "message": "Duplicate non-dict values"})


def _run(tmp_path, plans, extra=(), env_cfg=None):
    meg = os.path.join(str(tmp_path), "meg")
    os.makedirs(os.path.join(meg, "megatron", "core"), exist_ok=True)
    paths = [write_json(tmp_path, "%s.plan.json" % p["scenario"]["name"], p) for p in plans]
    out = os.path.join(str(tmp_path), "traces")
    cmd = [sys.executable, "-m", "replay", "run", "--megatron", meg, "--out-dir", out, "--python", FAKE_PYTHON,
           "--work-dir", os.path.join(str(tmp_path), "work"), "--abort-grace", "1.5"] + list(extra)
    for p in paths:
        cmd += ["--plan", p]
    env = dict(os.environ, FAKE_REPLAY=json.dumps(env_cfg or {}),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    traces = {}
    if os.path.isdir(out):
        for n in os.listdir(out):
            with open(os.path.join(out, n)) as f:
                traces[n.replace(".trace.json", "")] = json.load(f)
    return r, traces


def test_end_to_end_with_the_fake_worker(tmp_path):
    r, traces = _run(tmp_path, [synthetic("bug2-step-reset-dp2-to-4"), synthetic("bug1-duplicate-leaf-dp2-to-2")],
                     extra=["--emulate-te"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(traces) == {"bug2-step-reset-dp2-to-4", "bug1-duplicate-leaf-dp2-to-2"}
    for t in traces.values():
        assert ts.validate_trace(t) == []
        assert t["setup"]["te"] == "emulated" and t["setup"]["backend"] == "gloo"
    t = traces["bug2-step-reset-dp2-to-4"]
    assert [(run["id"], run["status"]) for run in t["runs"]] == [
        ("reference", "completed"), ("phase0", "completed"), ("phase1", "completed")]
    phase1 = t["runs"][2]
    assert phase1["load_from"] == "phase0" and phase1["dp"] == 4 and phase1["devices"] == [0, 0, 0, 0]
    assert [e["rank"] for e in phase1["events"][:4]] == [0, 1, 2, 3]
    assert t["megatron"]["upstream-2874"]["commit_source"] in ("plan", "git")
    assert t["plan"]["synthetic"] is True


def test_a_failed_rank_stops_the_others_and_later_phases_are_skipped(tmp_path):
    cfg = {"fail": {"phase0": {"rank": 0, "stage": "save", "py_type": "AssertionError", "message": "empty bucket"}},
           "hang": {"phase0": [1]}}
    r, traces = _run(tmp_path, [synthetic("bug2-step-reset-dp2-to-4")], env_cfg=cfg, extra=["--emulate-te"])
    assert r.returncode == 0, r.stdout + r.stderr
    t = traces["bug2-step-reset-dp2-to-4"]
    assert ts.validate_trace(t) == []
    ph0, ph1 = t["runs"][1], t["runs"][2]
    assert ph0["status"] == "failed"
    errs = sorted((e for e in ph0["events"] if e["at"] == "error"), key=lambda e: e["rank"])
    assert [(e["rank"], e["py_type"], e["secondary"]) for e in errs] == [(0, "AssertionError", False),
                                                                           (1, "PeerAborted", True)]
    # rank 1 hung in its save: its events up to there are kept, and it is aborted in that stage
    assert errs[1]["stage"] == "save"
    rank1 = [e["at"] for e in ph0["events"] if e["rank"] == 1]
    assert rank1 == ["init"] + ["after_step"] * 5 + ["error"]
    assert ph1["status"] == "skipped" and "phase0 did not complete" in ph1["skipped_reason"]


def test_a_crashed_worker_is_reported_and_replaced(tmp_path):
    cfg = {"crash": {"reference": [1]}}
    r, traces = _run(tmp_path, [synthetic("bug2-step-reset-dp2-to-4")], env_cfg=cfg, extra=["--emulate-te"])
    assert r.returncode == 0, r.stdout + r.stderr
    t = traces["bug2-step-reset-dp2-to-4"]
    ref, ph0 = t["runs"][0], t["runs"][1]
    assert ref["status"] == "failed"
    crash = [e for e in ref["events"] if e["at"] == "error"][0]
    assert crash["py_type"] == "WorkerCrash" and "exited with status 7" in crash["message"]
    assert crash["stage"] == "train" and crash["rank"] == 1
    assert [e["at"] for e in ref["events"] if e["rank"] == 1] == ["init", "error"]
    assert ph0["status"] == "completed"  # a new worker took rank 1's place


def test_a_checkout_that_does_not_import_fails_every_run(tmp_path):
    cfg = {"hello_fail": "ModuleNotFoundError: No module named 'miles_megatron_plugins'"}
    r, traces = _run(tmp_path, [synthetic("torch-adamw-resume-asserts")], env_cfg=cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    t = traces["torch-adamw-resume-asserts"]
    assert ts.validate_trace(t) == []
    ev = t["runs"][0]["events"][0]
    assert ev["py_type"] == "ModuleNotFoundError" and ev["stage"] == "init"
    assert ev["site"] == "gpt_model.py <module>()"


def test_fused_adam_without_te_is_skipped_unless_emulated(tmp_path):
    r, traces = _run(tmp_path, [synthetic("fused-adam-upstream-dp2-to-4")])
    t = traces["fused-adam-upstream-dp2-to-4"]
    assert all(run["status"] == "skipped" for run in t["runs"])
    assert "--emulate-te --fused-adam-standin" in t["runs"][0]["skipped_reason"]
    r, traces = _run(tmp_path, [synthetic("fused-adam-upstream-dp2-to-4")],
                     extra=["--emulate-te", "--fused-adam-standin"])
    t = traces["fused-adam-upstream-dp2-to-4"]
    assert all(run["status"] == "completed" and run["fused_adam_standin"] for run in t["runs"])


def test_nccl_when_there_are_enough_gpus(tmp_path):
    r, traces = _run(tmp_path, [synthetic("bug2-step-reset-dp2-to-4")], env_cfg={"gpus": 2}, extra=["--emulate-te"])
    t = traces["bug2-step-reset-dp2-to-4"]
    assert [run["backend"] for run in t["runs"]] == ["nccl", "nccl", "gloo"]
    assert t["setup"]["backend"] == "mixed" and t["setup"]["coalescing_workaround"] is True


def test_a_scenario_without_te_runs_megatrons_no_te_branches_even_with_emulate_te(tmp_path):
    sc_absent = synthetic("bug2-step-reset-dp2-to-4")
    sc_absent["scenario"]["optimizer"]["transformer_engine"] = "absent"
    r, traces = _run(tmp_path, [sc_absent], extra=["--emulate-te", "--fused-adam-standin"])
    assert r.returncode == 0, r.stdout + r.stderr
    t = traces["bug2-step-reset-dp2-to-4"]
    assert [run["te"] for run in t["runs"]] == ["absent"] * 3
    assert t["setup"]["te"] == "absent"


def test_a_hybrid_with_te_is_not_replayed_without_it(tmp_path):
    r, traces = _run(tmp_path, [synthetic("bug2-step-reset-dp2-to-4")])
    t = traces["bug2-step-reset-dp2-to-4"]
    assert all(run["status"] == "skipped" for run in t["runs"])
    assert "--emulate-te" in t["runs"][0]["skipped_reason"]


def test_a_job_that_died_at_a_storage_fault_leaves_no_worker_behind(tmp_path):
    """A crashed job's processes all end with it (a scheduler stops every rank): the rank that
    outlived the crash is replaced too, so nothing of the dead job reaches the next run (the H100
    replay of 2026-12-05, reports/crash-replay-2026-12-05.md: a survivor's next save looked
    wrong)."""
    with open(os.path.join(ROOT, "replay/plans/crash/crash-replay-crash-after-shard-upstream-2874.plan.json")) as f:
        plan = json.load(f)
    r, traces = _run(tmp_path, [plan], env_cfg={"storage_crash": {"phase1": 0}},
                     extra=["--emulate-te", "--fused-adam-standin"])
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {run["id"]: run for run in traces[plan["scenario"]["name"]]["runs"]}
    assert runs["phase1"].get("crashed") is True, json.dumps(runs["phase1"])[:900] + r.stdout[-1500:]
    assert "worker 1 (meg) outlived the crashed job: replaced" in r.stdout, r.stdout

