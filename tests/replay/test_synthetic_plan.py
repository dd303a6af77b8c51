import json
import os
import struct

from replay import synthetic_plan as sp
from replay import trace_schema as ts

from helpers import ROOT, synthetic


def _bf16_exact(x):
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return bits & 0xFFFF == 0


def test_initial_values_are_exact_in_bf16_and_dyadic():
    for i in range(4):
        for e in range(200):
            v = sp.initial_value(1, i, e)
            assert -0.5 <= v <= 0.5 and _bf16_exact(v) and v * 64 == int(v * 64)


def test_local_gradients_sum_to_the_batch_gradient_exactly_at_any_dp():
    for dp in (1, 2, 3, 4, 5, 8, 16):
        for sps in (1, 2, 8, 64):
            total = sum(sp.samples_on_rank(sps, dp, r) for r in range(dp))
            assert total == sps
            g = sp.batch_gradient(3, 1, 17)
            parts = [struct.unpack("<f", struct.pack("<f", g * sp.samples_on_rank(sps, dp, r) / sps))[0]
                     for r in range(dp)]
            # each part is exact in float32, and so is their sum
            assert all(p == g * sp.samples_on_rank(sps, dp, r) / sps for r, p in enumerate(parts))
            acc = 0.0
            for p in parts:
                acc = struct.unpack("<f", struct.pack("<f", acc + p))[0]
            assert acc == g


def test_plan_is_marked_synthetic_and_deterministic():
    a = synthetic("bug2-step-reset-dp2-to-4")
    b = synthetic("bug2-step-reset-dp2-to-4")
    assert a == b
    assert a["generator"]["synthetic"] is True
    assert "ckptsim replay-plan" in a["generator"]["note"]


def test_revision_profiles_resolve_with_extends_and_known_commits():
    profiles = sp._load_profiles([os.path.join(ROOT, "revisions")])
    assert sp._switches("fix-recommended", profiles)["sharded_step"] == "nonpersistent"  # from pr69-graft
    assert sp._switches("fix-recommended", profiles)["omit_step_when_loading"] is True
    # The pre-2874 profile names ae6707622e; the real parent of f4502eb1c9 is dceb1fb7ce.
    up = sp._upstream("upstream-pre-2874", profiles["upstream-pre-2874"], {})
    assert up["commit"].startswith("dceb1fb7ce")
    assert sp._upstream("fix-complete", profiles["fix-complete"], {}) is None
    over = sp._upstream("fix-complete", profiles["fix-complete"], {"fix-complete": ("radixark/Megatron-LM", "abcdef0")})
    assert over == {"repo": "radixark/Megatron-LM", "commit": "abcdef0"}
    # The object form a profile will carry wins over the stopgap table.
    prof = dict(profiles["upstream-2874"], upstream={"repo": "NVIDIA/Megatron-LM", "commit": "1234567"})
    assert sp._upstream("upstream-2874", prof, {})["commit"] == "1234567"


def test_cli_writes_valid_plans(tmp_path, capsys):
    out = os.path.join(str(tmp_path), "p.json")
    rc = sp.main([os.path.join(ROOT, "scenarios", "bug2-step-reset-dp2-to-4.json"), "-o", out,
                  "--revisions", os.path.join(ROOT, "revisions")])
    assert rc == 0
    with open(out) as f:
        plan = json.load(f)
    assert plan["format"] == "ckptsim-replay-plan"
    first = ts.decode_f32(plan["initial_params"]["w0"])[:3]
    assert first == [sp.initial_value(1, 0, e) for e in range(3)]
    rc = sp.main([os.path.join(ROOT, "scenarios", "bug2-step-reset-dp2-to-4.json"),
                  os.path.join(ROOT, "scenarios", "bug1-duplicate-leaf-dp2-to-2.json"),
                  "--out-dir", str(tmp_path)])
    assert rc == 0
    assert sorted(n for n in os.listdir(str(tmp_path)) if n.endswith(".plan.json")) == [
        "bug1-duplicate-leaf-dp2-to-2.plan.json", "bug2-step-reset-dp2-to-4.plan.json"]


def test_expert_gradients_reduced_over_an_expert_dp_group_sum_to_the_batch():
    # Each rank's expert gradient counts its EP group's samples; the expert-DP group of an EP
    # rank holds one rank of every EP group, so their counts add up to the whole batch.
    for dp, ep in ((2, 2), (4, 2), (4, 4), (8, 2), (6, 3), (3, 1)):
        for sps in (1, 8, 64):
            for e in range(ep):
                group = range(e, dp, ep)
                assert sum(sp.samples_of_ep_group(sps, dp, ep, r) for r in group) == sps
            # EP 1: a rank's EP group is the rank itself.
            assert [sp.samples_of_ep_group(sps, dp, 1, r) for r in range(dp)] == [
                sp.samples_on_rank(sps, dp, r) for r in range(dp)]
