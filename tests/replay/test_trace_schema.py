import copy
import struct

import pytest

from replay import trace_schema as ts

from helpers import minimal_trace


def test_fnv1a64_known_vectors():
    # FNV-1a 64 test vectors (Fowler/Noll/Vo): "" and "a", "foobar".
    assert ts.fnv1a64(b"") == 0xCBF29CE484222325
    assert ts.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert ts.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_hash_is_over_little_endian_float32_bytes():
    vals = [1.0, -0.0, 0.5, 3.140625]
    raw = b"".join(struct.pack("<f", v) for v in vals)
    assert ts.hash_f32(vals) == "%016x" % ts.fnv1a64(raw)
    assert ts.hash_f32([]) == "cbf29ce484222325"
    # -0.0 and +0.0 hash differently: the hash is over bits, not values.
    assert ts.hash_f32([0.0]) != ts.hash_f32([-0.0])
    # A float64 that is not a float32 is rounded first (what a float32 tensor would hold).
    assert ts.hash_f32([0.1]) == ts.hash_f32([struct.unpack("<f", struct.pack("<f", 0.1))[0]])


def test_hash_rejects_partial_floats():
    with pytest.raises(ValueError):
        ts.hash_f32_bytes(b"\x00\x00\x80")


def test_base64_float32_round_trip():
    vals = [0.0, -1.5, 2.0 ** -16, 65504.0]
    text = ts.encode_f32(vals)
    assert ts.decode_f32(text) == vals
    assert ts.decode_f32_bytes(text) == b"".join(struct.pack("<f", v) for v in vals)
    with pytest.raises(ValueError):
        ts.decode_f32("AAA")  # not a multiple of 4 bytes / bad padding
    with pytest.raises(ValueError):
        ts.decode_f32("!!!!")
    with pytest.raises(ValueError):
        ts.decode_f32(12)


def test_minimal_trace_is_valid():
    assert ts.validate_trace(minimal_trace()) == []


def test_a_part_may_name_its_kernel():
    t = copy.deepcopy(minimal_trace())
    t["runs"][0]["events"][2]["parts"][0]["kernel"] = "torch_fused_cpu"
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("fused,foreach,device,default,name", [
    (True, None, "cpu", False, "torch_fused_cpu"),      # the HDO's CPU part
    (True, None, "cuda", True, "torch_fused_cuda"),     # the HDO's GPU part without TE
    (None, None, "cuda", True, "torch_foreach_cuda"),   # DistOpt's AdamW without TE
    (None, None, "cpu", False, "torch_single_tensor_cpu"),
    (False, True, "cpu", False, "torch_foreach_cpu"),
    (None, False, "cuda", True, "torch_single_tensor_cuda"),
])
def test_torch_adamw_kernel_follows_torchs_choice(fused, foreach, device, default, name):
    assert ts.torch_adamw_kernel(fused, foreach, device, default) == name
    assert name in ts.KERNELS


def _mutate(fn):
    t = copy.deepcopy(minimal_trace())
    fn(t)
    return ts.validate_trace(t)


@pytest.mark.parametrize("mutation,needle", [
    (lambda t: t.update(format="other"), "format"),
    (lambda t: t.update(version=2), "version"),
    (lambda t: t.update(source="sim"), "source"),
    (lambda t: t["setup"].update(backend="mpi"), "setup.backend"),
    (lambda t: t["setup"].update(te="maybe"), "setup.te"),
    (lambda t: t["setup"].pop("coalescing_workaround"), "coalescing_workaround"),
    (lambda t: t["setup"].update(hash="md5"), "setup.hash"),
    (lambda t: t.update(extra=1), "extra"),
    (lambda t: t["runs"][0]["events"][2]["parts"][0].update(part="Lion"), "part"),
    (lambda t: t["runs"][0]["events"][2]["parts"][0].update(range=[4, 4]), "range"),
    (lambda t: t["runs"][0]["events"][2]["parts"][0].update(kernel="apex_fused_adam"), "kernel"),
    (lambda t: t["runs"][0]["events"][2]["parts"][0].update(step="1"), "step"),
    (lambda t: t["runs"][0]["events"][2]["hashes"]["master"].update(w0="XYZ"), "hashes.master.w0"),
    (lambda t: t["runs"][0]["events"][2]["hashes"]["model_param"].update(w0=None), "model_param.w0"),
    (lambda t: t["runs"][0]["events"][2]["hashes"]["exp_avg"].update(w9="cbf29ce484222325"), "exp_avg"),
    (lambda t: t["runs"][0]["events"][2].update(at="after_save"), "at"),
    (lambda t: t["runs"][0]["events"][2].update(rank=2), "rank"),
    (lambda t: t["runs"][0]["events"].reverse(), "ordered"),
    (lambda t: t["runs"][1].update(status="completed"), "completed run"),
    (lambda t: t["runs"][0].update(status="failed"), "failed run"),
    (lambda t: t["runs"][0].update(status="skipped"), "skipped"),
    (lambda t: t["runs"][1]["events"][0].update(stage="resume"), "stage"),
    (lambda t: t["runs"][1]["events"][0].update(merge_path="('optimizer',)"), "merge_path"),
    (lambda t: t["runs"][1]["events"][0].update(merge_kind="other"), "merge_kind"),
    (lambda t: t["runs"][1]["events"][0].pop("site"), "site"),
    (lambda t: t["runs"][1].update(id="reference"), "duplicate run id"),
])
def test_mutations_are_rejected(mutation, needle):
    errs = _mutate(mutation)
    assert errs, "mutation was accepted"
    assert any(needle in e for e in errs), errs


def test_values_must_match_hashes():
    t = minimal_trace()
    ev = t["runs"][0]["events"][2]
    ev["values"] = {"master": {"w0": ts.encode_f32([2.0])}}
    assert ts.validate_trace(t) == []
    assert ts.check_values_match_hashes(ev)  # the hashes hold [1.0]
    ev["values"] = {"master": {"w0": ts.encode_f32([float(ev["global_step"])])}}
    assert ts.check_values_match_hashes(ev) == []
    ev["values"] = {"master": {"w0": "%%"}}
    assert any("values.master.w0" in e for e in ts.validate_trace(t))


def test_uninitialized_names_hashes_of_the_event():
    t = minimal_trace()
    ev = t["runs"][0]["events"][2]
    ev["uninitialized"] = {"exp_avg": ["w0"], "master": ["w0"], "model_param": ["w0"]}
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("u,needle", [
    ({}, "leave the field out"),
    ({"exp_avg": []}, "non-empty array"),
    ({"exp_avg": "w0"}, "non-empty array"),
    ({"exp_avg": ["w9"]}, "no exp_avg hash"),
    ({"exp_avg": ["w0", "w0"]}, "twice"),
    ({"step": ["w0"]}, "unknown field"),
    (["w0"], "must be an object"),
])
def test_malformed_uninitialized_is_rejected(u, needle):
    t = minimal_trace()
    t["runs"][0]["events"][2]["uninitialized"] = u
    errs = ts.validate_trace(t)
    assert any(needle in e for e in errs), errs


def test_uninitialized_cannot_name_a_moment_that_does_not_exist():
    t = minimal_trace()
    ev = t["runs"][0]["events"][2]
    ev["hashes"]["exp_avg"]["w0"] = None
    ev["uninitialized"] = {"exp_avg": ["w0"]}
    assert any("no exp_avg hash" in e for e in ts.validate_trace(t))


def _after_step(t):
    return next(e for e in t["runs"][0]["events"] if e["at"] == "after_step")


def test_an_after_step_event_may_carry_its_groups():
    t = minimal_trace()
    _after_step(t)["groups"] = [{"wd_mult": 1.0, "lr_mult": 1.0, "lr": 0.01, "weight_decay": 0.1},
                                {"wd_mult": 0.0, "lr_mult": 2, "lr": 0.02, "weight_decay": 0.0}]
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("groups,needle", [
    ({"lr": 0.01}, "array of param groups"),
    ([{"wd_mult": 1.0, "lr_mult": 1.0, "lr": 0.01}], "weight_decay: is required"),
    ([{"wd_mult": 1.0, "lr_mult": 1.0, "lr": "0.01", "weight_decay": 0.1}], "must be a number"),
    ([{"wd_mult": True, "lr_mult": 1.0, "lr": 0.01, "weight_decay": 0.1}], "must be a number"),
    ([{"wd_mult": 1.0, "lr_mult": 1.0, "lr": 0.01, "weight_decay": 0.1, "step": 3}], "unknown field"),
])
def test_malformed_groups_are_rejected(groups, needle):
    t = minimal_trace()
    _after_step(t)["groups"] = groups
    errs = ts.validate_trace(t)
    assert any(needle in e for e in errs), errs


def test_only_an_after_step_event_carries_groups():
    t = minimal_trace()
    ev = next(e for e in t["runs"][0]["events"] if e["at"] != "after_step")
    ev["groups"] = [{"wd_mult": 1.0, "lr_mult": 1.0, "lr": 0.01, "weight_decay": 0.1}]
    assert any("only an after_step event" in e for e in ts.validate_trace(t))


# A precision-aware FusedAdam part's "state_dtypes" (issue 26, low-precision states).
def _fused_part(t):
    part = t["runs"][0]["events"][2]["parts"][0]
    part["part"] = "FusedAdam"
    return part


@pytest.mark.parametrize("dtypes", [
    {"exp_avg": "bf16", "exp_avg_sq": "fp16", "master_param": "int16"},
    {"exp_avg": "fp32", "exp_avg_sq": "fp32", "master_param": "fp32"},
    {"exp_avg": "bf16", "exp_avg_sq": "bf16"},  # a state left out where the optimizer holds none
    {},  # before the first step: no state at all
])
def test_a_fused_adam_part_may_name_its_state_dtypes(dtypes):
    t = copy.deepcopy(minimal_trace())
    _fused_part(t)["state_dtypes"] = dtypes
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("dtypes,needle", [
    ({"exp_avg": "fp8"}, "state_dtypes.exp_avg: must be one of bf16, fp16, fp32, got 'fp8'"),
    ({"exp_avg_sq": "int16"}, "state_dtypes.exp_avg_sq: must be one of bf16, fp16, fp32, got 'int16'"),
    ({"master_param": "bf16"}, "state_dtypes.master_param: must be one of fp32, int16, got 'bf16'"),
    ({"master_param": "torch.int16"}, "state_dtypes.master_param: must be one of fp32, int16"),
    ({"step": "fp32"}, "state_dtypes.step: unknown field"),
    ({"param": "int16"}, "state_dtypes.param: unknown field"),
    (["bf16", "bf16"], "state_dtypes: must be an object"),
])
def test_malformed_state_dtypes_are_rejected(dtypes, needle):
    t = copy.deepcopy(minimal_trace())
    _fused_part(t)["state_dtypes"] = dtypes
    errs = ts.validate_trace(t)
    assert any(needle in e for e in errs), errs


def test_only_a_fused_adam_part_carries_state_dtypes():
    t = copy.deepcopy(minimal_trace())
    t["runs"][0]["events"][2]["parts"][0]["state_dtypes"] = {"exp_avg": "fp32"}  # an "HDO cpu AdamW" part
    assert any("only a FusedAdam part carries state_dtypes" in e for e in ts.validate_trace(t))


# A part's optional "chain" (issue 26): its index in a chained optimizer of several parts.
def _two_part_event(t):
    ev = t["runs"][0]["events"][2]
    second = dict(ev["parts"][0], param="e0", range=[0, 4])
    ev["parts"].append(second)
    for kind in ("master", "exp_avg", "exp_avg_sq"):
        ev["hashes"][kind]["e0"] = ev["hashes"][kind]["w0"]
    return ev


def test_every_part_may_name_its_chain_index():
    t = copy.deepcopy(minimal_trace())
    ev = _two_part_event(t)
    ev["parts"][0]["chain"] = 0
    ev["parts"][1]["chain"] = 1
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("chain,needle", [
    (-1, "parts[1].chain: must be an integer >= 0, got -1"),
    ("1", "parts[1].chain: must be an integer >= 0, got '1'"),
    (True, "parts[1].chain: must be an integer >= 0, got True"),
    (1.0, "parts[1].chain: must be an integer >= 0, got 1.0"),
    (None, "parts[1].chain: must be an integer >= 0, got None"),
])
def test_a_malformed_chain_index_is_rejected(chain, needle):
    t = copy.deepcopy(minimal_trace())
    ev = _two_part_event(t)
    ev["parts"][0]["chain"] = 0
    ev["parts"][1]["chain"] = chain
    errs = ts.validate_trace(t)
    assert any(needle in e for e in errs), errs


def test_either_every_part_names_its_chain_index_or_none_does():
    t = copy.deepcopy(minimal_trace())
    ev = _two_part_event(t)
    ev["parts"][1]["chain"] = 1
    errs = ts.validate_trace(t)
    assert any("either every part names its chain index or none does (1 of 2 do)" in e for e in errs), errs
