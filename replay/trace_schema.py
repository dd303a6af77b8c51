"""The ckptsim trace, version 1, as code: constants, the state hash, float32 base64 helpers, and
a validator. replay/PLAN_AND_TRACE.md is the prose form of the same rules; both sides
(`python -m replay run` and `ckptsim run --trace-json`) write this schema.

Torch-free: standard library only.
"""

from __future__ import annotations

import base64
import math
import re
import sys
from array import array
from typing import Any, Dict, Iterable, List, Optional, Sequence

FORMAT = "ckptsim-trace"
VERSION = 1

SOURCES = ("real", "model")
BACKENDS = ("nccl", "gloo", "mixed", "in-process")
TE_MODES = ("real", "emulated", "absent")
SETUP_TE_MODES = TE_MODES + ("mixed", "modeled")
RUN_STATUSES = ("completed", "failed", "skipped")
POINTS = ("init", "after_load", "after_step", "at_save")
AT_VALUES = POINTS + ("error",)
STAGES = ("init", "load", "train", "save")
PARTS = ("FusedAdam", "AdamW", "HDO cpu AdamW", "HDO gpu FusedAdam", "HDO gpu AdamW")
HASH_KINDS = ("master", "exp_avg", "exp_avg_sq", "model_param")
# The arithmetic that updated a part (its optional "kernel"): torch AdamW's implementations as
# torch/optim/adam.py picks them, TE's FusedAdam, the runner's stand-in (ckptsim's op order), and
# the model's own TE FusedAdam emulation (ckptsim's traces).
KERNELS = ("torch_foreach_cuda", "torch_fused_cpu", "torch_fused_cuda", "torch_foreach_cpu",
           "torch_single_tensor_cpu", "torch_single_tensor_cuda", "te_fused_adam",
           "standin_fused_adam", "ckptsim_fused_adam")


def torch_adamw_kernel(fused: Any, foreach: Any, device: str, foreach_default: bool) -> str:
    """The torch AdamW implementation a step() runs (torch/optim/adam.py): `fused` runs
    _fused_adamw on the params' device; `foreach` None takes torch's default (foreach where
    every param is a CUDA tensor: `foreach_default`), True _multi_tensor_adam, False
    _single_tensor_adam. `device` is "cuda" or "cpu"."""
    if fused:
        return "torch_fused_" + device
    if foreach is None:
        foreach = foreach_default
    return ("torch_foreach_" if foreach else "torch_single_tensor_") + device
# A precision-aware FusedAdam part's optional "state_dtypes": the dtype of each state tensor that
# TE's FusedAdam holds for the shard (optimizer.state[param]), by state name: the moments in the
# scenario's exp_avg_dtype / exp_avg_sq_dtype, master_param fp32, or int16 where it holds the
# remainders of a bf16 param (store_param_remainders).
STATE_DTYPES = {"exp_avg": ("bf16", "fp16", "fp32"), "exp_avg_sq": ("bf16", "fp16", "fp32"),
                "master_param": ("fp32", "int16")}
MERGE_KINDS = ("duplicate_leaf", "list_length_mismatch")
HASH_NAME = "fnv1a64-f32le"

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


# ---------------------------------------------------------------------------------------------
# The state hash: FNV-1a 64 over the little-endian IEEE-754 binary32 bytes of the values, in
# element order, written as 16 lowercase hex digits. bf16 values are first widened to float32
# (exact). An empty array hashes to the offset basis, "cbf29ce484222325".
# ---------------------------------------------------------------------------------------------
def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    """FNV-1a 64 of `data` (the same function as ckptsim's sim::fnv1a)."""
    prime = FNV_PRIME
    mask = _MASK64
    for b in data:
        h = ((h ^ b) * prime) & mask
    return h


def f32_bytes(values: Iterable[float]) -> bytes:
    """Little-endian binary32 bytes of `values` (each rounded to float32)."""
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def hash_f32_bytes(data: bytes) -> str:
    """The trace hash of values already given as little-endian binary32 bytes."""
    if len(data) % 4:
        raise ValueError("float32 data must be a multiple of 4 bytes, got %d" % len(data))
    return "%016x" % fnv1a64(data)


def hash_f32(values: Iterable[float]) -> str:
    """The trace hash of a sequence of numbers, each rounded to float32."""
    return hash_f32_bytes(f32_bytes(values))


# ---------------------------------------------------------------------------------------------
# base64 float32 arrays (plan gradients and initial params, trace "values")
# ---------------------------------------------------------------------------------------------
def encode_f32(values: Iterable[float]) -> str:
    """Standard base64 (RFC 4648, with padding) of the little-endian binary32 bytes."""
    return base64.b64encode(f32_bytes(values)).decode("ascii")


def decode_f32_bytes(text: str) -> bytes:
    """The little-endian binary32 bytes a base64 string holds (validated: length % 4 == 0)."""
    if not isinstance(text, str):
        raise ValueError("a float32 array must be a base64 string, got %s" % type(text).__name__)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise ValueError("not valid base64: %s" % e) from None
    if len(raw) % 4:
        raise ValueError("base64 data is %d bytes, not a multiple of 4 (float32)" % len(raw))
    return raw


def decode_f32(text: str) -> List[float]:
    """The float32 values (as Python floats) of a base64 string."""
    a = array("f")
    a.frombytes(decode_f32_bytes(text))
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


# ---------------------------------------------------------------------------------------------
# Validator. validate_trace() returns a list of "path: problem" strings (empty = valid).
# ---------------------------------------------------------------------------------------------
class _V:
    def __init__(self) -> None:
        self.errors: List[str] = []

    def err(self, path: str, what: str) -> None:
        self.errors.append("%s: %s" % (path or "<root>", what))

    def obj(self, x: Any, path: str, required: Sequence[str], optional: Sequence[str] = ()) -> bool:
        if not isinstance(x, dict):
            self.err(path, "must be an object, got %s" % type(x).__name__)
            return False
        for k in required:
            if k not in x:
                self.err(_join(path, k), "is required")
        allowed = set(required) | set(optional)
        for k in x:
            if k not in allowed:
                self.err(_join(path, k), "unknown field (expected one of: %s)" % ", ".join(sorted(allowed)))
        return True

    def enum(self, x: Any, path: str, values: Sequence[str]) -> None:
        if x not in values:
            self.err(path, "must be one of %s, got %r" % (", ".join(values), x))

    def string(self, x: Any, path: str, nonempty: bool = False) -> None:
        if not isinstance(x, str) or (nonempty and not x):
            self.err(path, "must be a %sstring, got %r" % ("non-empty " if nonempty else "", x))

    def integer(self, x: Any, path: str, lo: int = 0) -> None:
        if not _is_int(x) or x < lo:
            self.err(path, "must be an integer >= %d, got %r" % (lo, x))

    def boolean(self, x: Any, path: str) -> None:
        if not isinstance(x, bool):
            self.err(path, "must be true or false, got %r" % (x,))

    def number_or_null(self, x: Any, path: str) -> None:
        if x is None:
            return
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            self.err(path, "must be a number or null, got %r" % (x,))


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return "%s[%d]" % (path, key)
    return "%s.%s" % (path, key) if path else str(key)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_trace(trace: Any) -> List[str]:
    """All schema problems of a trace object (parsed JSON); [] when it is valid."""
    v = _V()
    if not v.obj(trace, "", ["format", "version", "source", "megatron", "setup", "scenario", "runs"],
                 ["tool", "plan", "notes"]):
        return v.errors
    if trace.get("format") != FORMAT:
        v.err("format", "must be %r, got %r" % (FORMAT, trace.get("format")))
    if trace.get("version") != VERSION:
        v.err("version", "must be %d, got %r" % (VERSION, trace.get("version")))
    v.enum(trace.get("source"), "source", SOURCES)
    v.string(trace.get("scenario"), "scenario", nonempty=True)
    _validate_megatron(v, trace.get("megatron"), trace.get("source"))
    _validate_setup(v, trace.get("setup"))
    runs = trace.get("runs")
    if not isinstance(runs, list):
        v.err("runs", "must be an array")
        return v.errors
    ids = set()
    for i, run in enumerate(runs):
        path = _join("runs", i)
        _validate_run(v, run, path)
        if isinstance(run, dict):
            rid = run.get("id")
            if rid in ids:
                v.err(_join(path, "id"), "duplicate run id %r" % (rid,))
            ids.add(rid)
    return v.errors


def _validate_megatron(v: _V, m: Any, source: Any) -> None:
    if m is None:
        return
    if not isinstance(m, dict):
        v.err("megatron", "must be null or an object of revision -> {repo, commit, dir}")
        return
    for rev, info in m.items():
        path = _join("megatron", rev)
        if info is None:
            continue
        if v.obj(info, path, ["repo", "commit", "dir"], ["commit_source", "label"]):
            for k in ("repo", "commit", "dir"):
                if info.get(k) is not None:
                    v.string(info.get(k), _join(path, k))
            cs = info.get("commit_source")
            if cs is not None:
                v.enum(cs, _join(path, "commit_source"), ("stamp", "git", "plan", "unknown"))


def _validate_setup(v: _V, s: Any) -> None:
    if not v.obj(s, "setup", ["backend", "gpus", "coalescing_workaround", "te", "fused_adam_standin", "torch"],
                 ["hash", "adaptations", "python", "collective_timeout_s", "values", "device_names",
                  "transformer_engine", "apex"]):
        return
    v.enum(s.get("backend"), "setup.backend", BACKENDS)
    v.integer(s.get("gpus"), "setup.gpus")
    v.boolean(s.get("coalescing_workaround"), "setup.coalescing_workaround")
    v.enum(s.get("te"), "setup.te", SETUP_TE_MODES)
    v.boolean(s.get("fused_adam_standin"), "setup.fused_adam_standin")
    if s.get("torch") is not None:
        v.string(s.get("torch"), "setup.torch")
    if "hash" in s and s["hash"] != HASH_NAME:
        v.err("setup.hash", "must be %r, got %r" % (HASH_NAME, s["hash"]))
    if "adaptations" in s:
        a = s["adaptations"]
        if not isinstance(a, list) or not all(isinstance(x, str) for x in a):
            v.err("setup.adaptations", "must be an array of strings")


def _validate_run(v: _V, run: Any, path: str) -> None:
    if not v.obj(run, path, ["id", "dp", "revision", "status", "events"],
                 ["phase", "tp", "pp", "start_step", "steps", "load", "save", "backend", "te", "fused_adam_standin",
                  "coalescing_workaround", "skipped_reason", "wall_s", "load_from", "resumed_from", "devices",
                  "storage_faults", "crashed"]):
        return
    v.string(run.get("id"), _join(path, "id"), nonempty=True)
    v.integer(run.get("dp"), _join(path, "dp"), lo=1)
    v.string(run.get("revision"), _join(path, "revision"), nonempty=True)
    v.enum(run.get("status"), _join(path, "status"), RUN_STATUSES)
    if "backend" in run:
        v.enum(run["backend"], _join(path, "backend"), BACKENDS)
    if "te" in run:
        v.enum(run["te"], _join(path, "te"), TE_MODES + ("modeled",))
    for k in ("fused_adam_standin", "coalescing_workaround", "load", "save"):
        if k in run:
            v.boolean(run[k], _join(path, k))
    for k in ("start_step", "steps", "phase"):
        if k in run:
            v.integer(run[k], _join(path, k))
    for k in ("tp", "pp"):
        if k in run:
            v.integer(run[k], _join(path, k), lo=1)
    if "resumed_from" in run:
        v.string(run["resumed_from"], _join(path, "resumed_from"), nonempty=True)
        if not run.get("load"):
            v.err(_join(path, "resumed_from"), "only a run that loads resumes from a checkpoint")
    if "storage_faults" in run:
        sf = run["storage_faults"]
        if not isinstance(sf, list) or not sf or not all(isinstance(x, str) and x for x in sf):
            v.err(_join(path, "storage_faults"), "must be a non-empty array of the faults that fired (strings)")
    if "crashed" in run:
        v.boolean(run["crashed"], _join(path, "crashed"))
        if run["crashed"] and not run.get("storage_faults"):
            v.err(_join(path, "crashed"), "only a run whose save met a storage fault crashes")
        if run["crashed"] and run.get("status") != "failed":
            v.err(_join(path, "status"), "a crashed run is failed (its ranks stopped in the save)")
    if run.get("status") == "skipped":
        if not isinstance(run.get("skipped_reason"), str) or not run.get("skipped_reason"):
            v.err(_join(path, "skipped_reason"), "a skipped run must say why")
    events = run.get("events")
    if not isinstance(events, list):
        v.err(_join(path, "events"), "must be an array")
        return
    # Events name world ranks: TP x PP x DP of them.
    sizes = [run.get(k, 1) for k in ("tp", "pp", "dp")]
    dp = sizes[0] * sizes[1] * sizes[2] if all(_is_int(x) for x in sizes) else None
    seen_per_rank: Dict[int, int] = {}
    last_key = (-1, -1)
    has_error = False
    for j, ev in enumerate(events):
        epath = _join(_join(path, "events"), j)
        _validate_event(v, ev, epath, dp)
        if not isinstance(ev, dict) or not _is_int(ev.get("rank")):
            continue
        rank = ev["rank"]
        ordinal = seen_per_rank.get(rank, 0)
        seen_per_rank[rank] = ordinal + 1
        key = (ordinal, rank)
        if key < last_key:
            v.err(epath, "events must be ordered by (position in the rank's own sequence, rank)")
        last_key = key
        if ev.get("at") == "error":
            has_error = True
    if run.get("status") == "failed" and not has_error:
        v.err(_join(path, "status"), "a failed run must hold at least one error event")
    if run.get("status") == "completed" and has_error:
        v.err(_join(path, "status"), "a completed run must hold no error event")


def _validate_event(v: _V, ev: Any, path: str, dp: Optional[int]) -> None:
    if not isinstance(ev, dict):
        v.err(path, "must be an object")
        return
    at = ev.get("at")
    if at == "error":
        if not v.obj(ev, path, ["rank", "at", "stage", "py_type", "message", "site", "merge_path"],
                     ["merge_kind", "site_line", "secondary", "global_step", "traceback"]):
            return
        v.enum(ev.get("stage"), _join(path, "stage"), STAGES)
        v.string(ev.get("py_type"), _join(path, "py_type"), nonempty=True)
        v.string(ev.get("message"), _join(path, "message"))
        v.string(ev.get("site"), _join(path, "site"))
        mp = ev.get("merge_path")
        if mp is not None and (not isinstance(mp, list) or not all(isinstance(x, str) for x in mp)):
            v.err(_join(path, "merge_path"), "must be null or an array of Python key reprs (strings)")
        if ev.get("merge_kind") is not None:
            v.enum(ev.get("merge_kind"), _join(path, "merge_kind"), MERGE_KINDS)
        if "secondary" in ev:
            v.boolean(ev["secondary"], _join(path, "secondary"))
        if ev.get("global_step") is not None:
            v.integer(ev.get("global_step"), _join(path, "global_step"))
    else:
        if not v.obj(ev, path, ["rank", "at", "global_step", "parts", "hashes"],
                     ["values", "uninitialized", "groups", "unwritten"]):
            return
        v.enum(at, _join(path, "at"), POINTS)
        v.integer(ev.get("global_step"), _join(path, "global_step"))
        _validate_parts(v, ev.get("parts"), _join(path, "parts"))
        _validate_hashes(v, ev.get("hashes"), _join(path, "hashes"), ev.get("parts"))
        if "values" in ev:
            _validate_values(v, ev["values"], _join(path, "values"))
        if "uninitialized" in ev:
            _validate_uninitialized(v, ev["uninitialized"], _join(path, "uninitialized"), ev.get("hashes"))
        if "groups" in ev:
            _validate_groups(v, ev["groups"], _join(path, "groups"), at)
        if "unwritten" in ev:
            _validate_unwritten(v, ev["unwritten"], _join(path, "unwritten"), at)
    rank = ev.get("rank")
    if not _is_int(rank) or rank < 0 or (dp is not None and rank >= dp):
        v.err(_join(path, "rank"), "must be an integer in [0, tp * pp * dp), got %r" % (rank,))


def _validate_parts(v: _V, parts: Any, path: str) -> None:
    if not isinstance(parts, list):
        v.err(path, "must be an array")
        return
    chained = []  # per part: whether it names its chain index
    for i, p in enumerate(parts):
        ppath = _join(path, i)
        if not v.obj(p, ppath, ["part", "param", "range", "step", "step_used"],
                     ["step_aliases", "kernel", "state_dtypes", "chain"]):
            continue
        if "chain" in p:
            v.integer(p["chain"], _join(ppath, "chain"))
        chained.append("chain" in p)
        v.enum(p.get("part"), _join(ppath, "part"), PARTS)
        if "kernel" in p:
            v.enum(p["kernel"], _join(ppath, "kernel"), KERNELS)
        if "state_dtypes" in p:
            _validate_state_dtypes(v, p["state_dtypes"], _join(ppath, "state_dtypes"), p.get("part"))
        v.string(p.get("param"), _join(ppath, "param"), nonempty=True)
        r = p.get("range")
        if (not isinstance(r, list) or len(r) != 2 or not all(_is_int(x) for x in r)
                or r[0] < 0 or r[1] <= r[0]):
            v.err(_join(ppath, "range"), "must be [a, b] with 0 <= a < b, got %r" % (r,))
        v.number_or_null(p.get("step"), _join(ppath, "step"))
        v.number_or_null(p.get("step_used"), _join(ppath, "step_used"))
        if "step_aliases" in p:
            v.integer(p["step_aliases"], _join(ppath, "step_aliases"))
    if any(chained) and not all(chained):
        # A rank's chained optimizer has the same parts at every event: with more than one,
        # every part names its index; with one, none does.
        v.err(path, "either every part names its chain index or none does (%d of %d do)"
              % (sum(chained), len(chained)))


def _validate_state_dtypes(v: _V, dtypes: Any, path: str, part: Any) -> None:
    """Optional "state_dtypes" of a part: only a FusedAdam part's (the precision-aware FusedAdam's;
    HDO and AdamW parts never carry it), an object of state name -> dtype name from STATE_DTYPES,
    a state left out where the optimizer holds no such tensor ({} before the first step)."""
    if part != "FusedAdam":
        v.err(path, "only a FusedAdam part carries state_dtypes (a precision-aware FusedAdam's), got it on %r"
              % (part,))
    if not v.obj(dtypes, path, [], list(STATE_DTYPES)):
        return
    for name, dtype in dtypes.items():
        if name in STATE_DTYPES:
            v.enum(dtype, _join(path, name), STATE_DTYPES[name])


def _validate_hashes(v: _V, hashes: Any, path: str, parts: Any) -> None:
    if not v.obj(hashes, path, list(HASH_KINDS)):
        return
    for kind in HASH_KINDS:
        m = hashes.get(kind)
        kpath = _join(path, kind)
        if not isinstance(m, dict):
            v.err(kpath, "must be an object of param name -> hash or null")
            continue
        for name, h in m.items():
            if h is None and kind != "model_param":
                continue
            if not isinstance(h, str) or not _HEX16.match(h):
                v.err(_join(kpath, name), "must be 16 lowercase hex digits%s, got %r"
                      % ("" if kind == "model_param" else " or null", h))
    if isinstance(parts, list):
        names = [p.get("param") for p in parts if isinstance(p, dict)]
        for kind in ("master", "exp_avg", "exp_avg_sq"):
            m = hashes.get(kind)
            if isinstance(m, dict) and sorted(m) != sorted(set(names)):
                v.err(_join(path, kind), "must have one entry per part's param (%s), got %s"
                      % (sorted(set(names)), sorted(m)))


def _validate_groups(v: _V, groups: Any, path: str, at: Any) -> None:
    """Optional "groups" (after_step only): every param group's multipliers and the lr and
    weight decay it held when the step ran."""
    if at != "after_step":
        v.err(path, "only an after_step event carries groups (the values the step used)")
        return
    if not isinstance(groups, list):
        v.err(path, "must be an array of param groups")
        return
    for i, g in enumerate(groups):
        gpath = _join(path, i)
        if not v.obj(g, gpath, ["wd_mult", "lr_mult", "lr", "weight_decay"]):
            continue
        for key in ("wd_mult", "lr_mult", "lr", "weight_decay"):
            x = g.get(key)
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                v.err(_join(gpath, key), "must be a number, got %r" % (x,))


def _validate_unwritten(v: _V, items: Any, path: str, at: Any) -> None:
    """Optional "unwritten" (after_load only): every requested range the load left unwritten on
    this rank, sorted by key and range; [] where it wrote every element it was asked for."""
    if at != "after_load":
        v.err(path, "only an after_load event carries unwritten (what that load left)")
        return
    if not isinstance(items, list):
        v.err(path, "must be an array of {key, range, missing_key}")
        return
    previous = None
    for i, e in enumerate(items):
        epath = _join(path, i)
        if not v.obj(e, epath, ["key", "range", "missing_key"]):
            continue
        v.string(e.get("key"), _join(epath, "key"), nonempty=True)
        v.boolean(e.get("missing_key"), _join(epath, "missing_key"))
        r = e.get("range")
        if (not isinstance(r, list) or len(r) != 2 or not all(_is_int(x) for x in r)
                or r[0] < 0 or r[1] <= r[0]):
            v.err(_join(epath, "range"), "must be [a, b] with 0 <= a < b, got %r" % (r,))
            continue
        here = (e.get("key"), r[0], r[1])
        if previous is not None and isinstance(here[0], str) and here < previous:
            v.err(epath, "must come after %r: sorted by key, then range" % (list(previous),))
        previous = here


def _validate_uninitialized(v: _V, u: Any, path: str, hashes: Any) -> None:
    """Optional "uninitialized": per hash kind, the params whose hash of this event rests on
    uninitialized memory. Written only when some does: no empty object, no empty list."""
    if not v.obj(u, path, [], list(HASH_KINDS)):
        return
    if not u:
        v.err(path, "must name at least one kind (leave the field out when no hash rests on "
                    "uninitialized memory)")
    for kind, names in u.items():
        kpath = _join(path, kind)
        if not isinstance(names, list) or not names:
            v.err(kpath, "must be a non-empty array of param names")
            continue
        hashed = hashes.get(kind) if isinstance(hashes, dict) else None
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                v.err(_join(kpath, i), "must be a param name, got %r" % (name,))
            elif not isinstance(hashed, dict) or hashed.get(name) is None:
                v.err(_join(kpath, i), "names %r, which has no %s hash in this event" % (name, kind))
        if len(set(n for n in names if isinstance(n, str))) != len(names):
            v.err(kpath, "names a param twice")


def _validate_values(v: _V, values: Any, path: str) -> None:
    if not v.obj(values, path, [], list(HASH_KINDS)):
        return
    for kind, m in values.items():
        if not isinstance(m, dict):
            v.err(_join(path, kind), "must be an object of param name -> base64 float32 or null")
            continue
        for name, text in m.items():
            if text is None:
                continue
            try:
                decode_f32_bytes(text)
            except ValueError as e:
                v.err(_join(_join(path, kind), name), str(e))


def check_values_match_hashes(event: Dict[str, Any]) -> List[str]:
    """For an event that carries "values": every value array must hash to its "hashes" entry."""
    out = []
    for kind, m in (event.get("values") or {}).items():
        for name, text in m.items():
            want = event["hashes"][kind].get(name)
            got = None if text is None else hash_f32_bytes(decode_f32_bytes(text))
            if got != want:
                out.append("%s[%s]: values hash to %s, hashes say %s" % (kind, name, got, want))
    return out


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
