"""`run --resume-from [RUN=]DIR`: a run loads a given checkpoint directory (the cross-load of a
checkpoint the model saved) instead of the earlier run's save; torch-free parts and a whole run
against the fake worker."""

import json
import os
import subprocess
import sys

import pytest

from replay import checkpoint_layout as layout
from replay import trace_schema as ts

from helpers import FAKE_PYTHON, ROOT, synthetic, write_json


def _checkpoint(root, iteration=5):
    os.makedirs(layout.iteration_dir(str(root), iteration))
    layout.write_tracker(str(root), iteration)
    return str(root)


@pytest.mark.parametrize("spec,want", [
    ("phase1=/x/y", [("phase1", "/x/y")]),
    ("/x/y", [(None, "/x/y")]),
    ("rel/dir", [(None, "rel/dir")]),
    ("/x/a=b", [(None, "/x/a=b")]),  # no run id before '=': the whole text is the directory
    (".campaign/xload/{scenario}/phase_0", [(None, ".campaign/xload/{scenario}/phase_0")]),
])
def test_parse_resume_from(spec, want):
    assert layout.parse_resume_from([spec]) == want


def test_parse_resume_from_refuses_an_empty_directory():
    with pytest.raises(layout.LayoutError):
        layout.parse_resume_from(["phase1="])


def test_resume_dirs_default_to_the_first_loading_run_and_expand_the_scenario(tmp_path):
    plan = synthetic("bug2-step-reset-dp2-to-4")
    name = plan["scenario"]["name"]
    _checkpoint(tmp_path / name / "phase_0")
    specs = layout.parse_resume_from([str(tmp_path / "{scenario}" / "phase_0")])
    assert layout.resume_dirs_for(plan, specs) == {"phase1": str(tmp_path / name / "phase_0")}


@pytest.mark.parametrize("spec,words", [
    ("phase7={d}", "has no run 'phase7'"),
    ("phase0={d}", "does not load"),
    ("phase1={d}/missing", "cannot read the checkpoint tracker"),
])
def test_resume_dirs_refuse_what_cannot_be_loaded(tmp_path, spec, words):
    plan = synthetic("bug2-step-reset-dp2-to-4")
    d = _checkpoint(tmp_path / "ck")
    with pytest.raises(layout.LayoutError) as e:
        layout.resume_dirs_for(plan, layout.parse_resume_from([spec.format(d=d)]))
    assert words in str(e.value)


def test_resume_dirs_refuse_a_run_named_twice(tmp_path):
    plan = synthetic("bug2-step-reset-dp2-to-4")
    d = _checkpoint(tmp_path / "ck")
    with pytest.raises(layout.LayoutError) as e:
        layout.resume_dirs_for(plan, layout.parse_resume_from([d, "phase1=" + d]))
    assert "named twice" in str(e.value)


def test_a_resumed_run_is_recorded_in_the_trace_schema():
    from helpers import minimal_trace

    t = minimal_trace()
    resumed = next(r for r in t["runs"] if r.get("load"))
    resumed["resumed_from"] = "/ckpt/phase_0"
    assert ts.validate_trace(t) == []
    resumed["resumed_from"] = ""
    assert any("resumed_from" in p for p in ts.validate_trace(t))
    del resumed["resumed_from"]
    t["runs"][0]["resumed_from"] = "/ckpt"
    assert any("only a run that loads" in p for p in ts.validate_trace(t))


def _run(tmp_path, plan, extra):
    meg = os.path.join(str(tmp_path), "meg")
    os.makedirs(os.path.join(meg, "megatron", "core"), exist_ok=True)
    path = write_json(tmp_path, "p.plan.json", plan)
    out = os.path.join(str(tmp_path), "traces")
    cmd = [sys.executable, "-m", "replay", "run", "--megatron", meg, "--out-dir", out, "--python", FAKE_PYTHON,
           "--work-dir", os.path.join(str(tmp_path), "work"), "--abort-grace", "1.5", "--plan", path] + extra
    env = dict(os.environ, FAKE_REPLAY=json.dumps({"fail": {"phase0": {"rank": 0, "stage": "save",
                                                                       "py_type": "AssertionError",
                                                                       "message": "x"}}}),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    traces = {}
    if os.path.isdir(out):
        for n in os.listdir(out):
            with open(os.path.join(out, n)) as f:
                traces[n] = json.load(f)
    return r, traces


def test_the_resumed_run_loads_the_given_directory_even_when_its_source_failed(tmp_path):
    plan = synthetic("bug2-step-reset-dp2-to-4")
    d = _checkpoint(tmp_path / "model-ckpt")
    r, traces = _run(tmp_path, plan, ["--emulate-te", "--resume-from", "phase1=" + d])
    assert r.returncode == 0, r.stdout + r.stderr
    (t,) = traces.values()
    assert ts.validate_trace(t) == []
    ph0, ph1 = t["runs"][1], t["runs"][2]
    assert ph0["status"] == "failed"  # without --resume-from phase1 would be skipped
    assert ph1["status"] == "completed"
    assert ph1["resumed_from"] == d and ph1["load_from"] == "phase0"
    assert [e["at"] for e in ph1["events"] if e["rank"] == 0][0] == "after_load"
    assert "fake worker loaded %s" % d in t["setup"]["adaptations"]
    assert "resumed from %s" % d in r.stdout


def test_a_bad_resume_from_is_exit_2_before_anything_runs(tmp_path):
    plan = synthetic("bug2-step-reset-dp2-to-4")
    r, traces = _run(tmp_path, plan, ["--emulate-te", "--resume-from", str(tmp_path / "nothing")])
    assert r.returncode == 2 and "cannot read the checkpoint tracker" in r.stderr
    assert traces == {}
