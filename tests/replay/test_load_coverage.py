"""replay/load_coverage.py: the probe of which elements a load wrote (load_writes_every_element on
the real code), and the trace's `unwritten` field. The pure parts run everywhere; the probe
itself needs torch and a Megatron checkout (`.megatron/` or CKPTSIM_MEGATRON_ROOT) and skips
without them, with the reason."""

import os
import sys

import pytest

from replay import load_coverage as lc
from replay import trace_schema as ts

from helpers import minimal_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ranges_of_gives_maximal_runs():
    assert lc.ranges_of([]) == []
    assert lc.ranges_of([False, False]) == []
    assert lc.ranges_of([True]) == [(0, 1)]
    assert lc.ranges_of([True, True, False, True, False, False, True, True]) == [(0, 2), (3, 4), (6, 8)]


def test_entries_are_in_the_keys_global_space_and_sorted():
    got = lc.entries("k.b", 100, [(0, 2), (5, 6)], False) + lc.entries("k.a", 0, [(3, 4)], True)
    assert lc.sort_entries(got) == [
        {"key": "k.a", "range": [3, 4], "missing_key": True},
        {"key": "k.b", "range": [100, 102], "missing_key": False},
        {"key": "k.b", "range": [105, 106], "missing_key": False}]


def test_the_sentinels_are_quiet_nans_of_their_width():
    import struct
    assert struct.unpack("<f", struct.pack("<I", lc.SENTINEL_BITS["float32"]))[0] != 0  # NaN != NaN
    f = struct.unpack("<f", struct.pack("<I", lc.SENTINEL_BITS["float32"]))[0]
    assert f != f
    d = struct.unpack("<d", struct.pack("<Q", lc.SENTINEL_BITS["float64"]))[0]
    assert d != d
    # bf16 is the top half of a float32; fp16's exponent is 5 bits of ones.
    bf = struct.unpack("<f", struct.pack("<I", lc.SENTINEL_BITS["bfloat16"] << 16))[0]
    assert bf != bf
    assert (lc.SENTINEL_BITS["float16"] >> 10) & 0x1F == 0x1F and lc.SENTINEL_BITS["float16"] & 0x3FF
    for bits, width in ((lc.SENTINEL_BITS["float16"], 16), (lc.SENTINEL_BITS["bfloat16"], 16),
                        (lc.SENTINEL_BITS["float32"], 32), (lc.SENTINEL_BITS["float64"], 64)):
        assert 0 < bits < (1 << (width - 1))  # fits the signed integer view


def _after_load(t):
    return next(e for e in t["runs"][1]["events"] if e["at"] == "after_load")


def test_an_after_load_event_may_carry_what_the_load_left_unwritten():
    t = minimal_trace()
    _after_load(t)["unwritten"] = []
    assert ts.validate_trace(t) == []
    _after_load(t)["unwritten"] = [{"key": "a", "range": [0, 4], "missing_key": True},
                                   {"key": "b", "range": [2, 3], "missing_key": False}]
    assert ts.validate_trace(t) == []


@pytest.mark.parametrize("items,needle", [
    ({"key": "a"}, "array of {key, range, missing_key}"),
    ([{"key": "a", "range": [0, 4]}], "missing_key: is required"),
    ([{"key": "", "range": [0, 4], "missing_key": False}], "key"),
    ([{"key": "a", "range": [4, 4], "missing_key": False}], "0 <= a < b"),
    ([{"key": "a", "range": [0, 4], "missing_key": 1}], "missing_key"),
    ([{"key": "b", "range": [0, 4], "missing_key": False},
      {"key": "a", "range": [0, 4], "missing_key": False}], "sorted by key, then range"),
])
def test_malformed_unwritten_is_rejected(items, needle):
    t = minimal_trace()
    _after_load(t)["unwritten"] = items
    errs = ts.validate_trace(t)
    assert any(needle in e for e in errs), errs


def test_only_an_after_load_event_carries_unwritten():
    t = minimal_trace()
    ev = next(e for e in t["runs"][0]["events"] if e["at"] == "after_step")
    ev["unwritten"] = []
    assert any("only an after_load event" in e for e in ts.validate_trace(t))


# ---------------------------------------------------------------------------------- the probe

def _mapping():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    root = os.environ.get("CKPTSIM_MEGATRON_ROOT", os.path.join(ROOT, ".megatron"))
    checkout = os.path.join(root, "nv-d98e8a64dd")
    if not os.path.isdir(os.path.join(checkout, "megatron", "core")):
        pytest.skip("no Megatron checkout %s (replay/fetch-megatron.sh)" % checkout)
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    try:
        from megatron.core.dist_checkpointing.mapping import ShardedTensor
    except Exception as e:  # noqa: BLE001
        pytest.skip("megatron.core.dist_checkpointing does not import here: %r" % (e,))
    return torch, ShardedTensor


def test_the_probe_finds_what_a_load_left_and_restores_it():
    torch, ShardedTensor = _mapping()
    a = torch.arange(8, dtype=torch.float32) + 0.5
    b = torch.arange(6, dtype=torch.bfloat16)
    shared = torch.arange(4, dtype=torch.float32)
    sd = {"x": {"a": ShardedTensor.from_rank_offsets("k.a", a, (0, 1, 2)),  # global offset 8
                "n": 3},
          "y": [ShardedTensor.from_rank_offsets("k.b", b),
                ShardedTensor.from_rank_offsets("k.s", shared[1:3])],
          "z": ShardedTensor.from_rank_offsets("k.z", shared[0:2])}
    before = {k: t.clone() for k, t in (("a", a), ("b", b), ("shared", shared))}
    probe = lc.Probe(sd)
    assert probe.unchecked == 0
    assert torch.isnan(a).all() and torch.isnan(shared[:3]).all()  # shared[3]: no request's
    assert not torch.isnan(shared[3])
    # The "load": writes a[2:8] and all of b in place; k.s and k.z are not in the checkpoint.
    a[2:8] = 100.0
    b.fill_(7)
    loaded = {"x": {"a": a, "n": 3}, "y": [b, shared[1:3]], "z": shared[0:2]}
    got = probe.finish(loaded, {"k.a", "k.b"})
    assert got == [{"key": "k.a", "range": [8, 10], "missing_key": False},
                   {"key": "k.s", "range": [0, 2], "missing_key": True},
                   {"key": "k.z", "range": [0, 2], "missing_key": True}]
    # Unwritten elements hold what they held before the probe; written ones what the load wrote.
    assert torch.equal(a[:2], before["a"][:2]) and (a[2:] == 100.0).all()
    assert (b == 7).all()
    assert torch.equal(shared, before["shared"])


def test_the_probe_leaves_integer_and_two_dimensional_requests_alone():
    torch, ShardedTensor = _mapping()
    i = torch.arange(4, dtype=torch.int64)
    m = torch.ones(2, 3)
    sd = {"i": ShardedTensor.from_rank_offsets("k.i", i), "m": ShardedTensor.from_rank_offsets("k.m", m)}
    probe = lc.Probe(sd)
    assert probe.unchecked == 2
    assert torch.equal(i, torch.arange(4)) and (m == 1).all()
    assert probe.finish({"i": i, "m": m}, {"k.i", "k.m"}) == []
