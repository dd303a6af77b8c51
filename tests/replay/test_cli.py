import json
import os
import subprocess
import sys

from replay import cli

from helpers import DATA, ROOT, minimal_trace, synthetic, write_json


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "replay"] + list(args), capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_help_lists_the_commands():
    r = _cli("-h")
    assert r.returncode == 0
    for c in ("run", "validate-plan", "validate-trace", "summarize", "diff", "synthetic-plan"):
        assert c in r.stdout
    r = _cli("run", "-h")
    for opt in ("--plan", "--megatron", "--megatron-root", "--out", "--out-dir", "--backend", "--emulate-te",
                "--fused-adam-standin", "--values"):
        assert opt in r.stdout


def test_run_argument_errors(tmp_path):
    p = write_json(tmp_path, "p.json", synthetic("torch-adamw-resume-asserts"))
    meg = os.path.join(str(tmp_path), "m")
    os.makedirs(os.path.join(meg, "megatron", "core"))
    r = _cli("run", "--plan", p, "--megatron", meg, "--out", "t.json", "--fused-adam-standin")
    assert r.returncode == 2 and "--emulate-te" in r.stderr
    r = _cli("run", "--plan", p, "--plan", p, "--megatron", meg, "--out", "t.json")
    assert r.returncode == 2 and "--out-dir" in r.stderr
    r = _cli("run", "--plan", p, "--out", "t.json")
    assert r.returncode == 2 and "name a checkout" in r.stderr
    r = _cli("run", "--plan", p, "--megatron", str(tmp_path), "--out", "t.json")
    assert r.returncode == 2 and "holds no megatron/core" in r.stderr
    bad = write_json(tmp_path, "bad.json", {"format": "nope"})
    r = _cli("run", "--plan", bad, "--megatron", meg, "--out", "t.json")
    assert r.returncode == 2 and "not a valid replay plan" in r.stderr
    r = _cli("run", "--plan", p, "--megatron", meg, "--out", "t.json", "--backend", "mpi")
    assert r.returncode == 2


def test_dry_run_prints_the_mapping(tmp_path):
    p = write_json(tmp_path, "p.json", synthetic("bug1-duplicate-leaf-dp2-to-2"))
    meg = os.path.join(str(tmp_path), "m")
    os.makedirs(os.path.join(meg, "megatron", "core"))
    r = _cli("run", "--plan", p, "--megatron", "miles-main=" + meg, "--out", "t.json", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "miles-main" in r.stdout and meg in r.stdout
    assert "upstream-2874      NOT REPLAYED: no checkout of NVIDIA/Megatron-LM@f4502eb1c9" in r.stdout


def test_validate_and_summarize_and_diff(tmp_path):
    good = write_json(tmp_path, "good.json", minimal_trace())
    t = minimal_trace()
    t["runs"][0]["events"][2]["parts"][0]["step"] = 7.0
    changed = write_json(tmp_path, "changed.json", t)
    bad = write_json(tmp_path, "bad.json", {"format": "ckptsim-trace"})
    assert cli.main(["validate-trace", good]) == 0
    assert cli.main(["validate-trace", good, bad]) == 1
    assert cli.main(["summarize", "--steps", good]) == 0
    assert cli.main(["diff", good, good]) == 0
    assert cli.main(["diff", good, changed]) == 1
    plan = write_json(tmp_path, "plan.json", synthetic("bug2-step-reset-dp2-to-4"))
    assert cli.main(["validate-plan", "--check-grads", plan]) == 0
    assert cli.main(["validate-plan", bad]) == 1


def test_summarize_a_recorded_trace(capsys):
    name = [n for n in os.listdir(DATA) if n.startswith("bug2-step-reset-dp2-to-4__") and "emulated" in n][0]
    assert cli.main(["summarize", "--steps", os.path.join(DATA, name)]) == 0
    out = capsys.readouterr().out
    assert "rank 0 after_load gs=5" in out and "HDO cpu AdamW step=1" in out
    assert "phase1 rank 0 after_load gs=5 w1 HDO cpu AdamW: step=1.0 (uninterrupted: 5)" in out
