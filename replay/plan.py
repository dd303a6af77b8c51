"""The ckptsim replay plan, version 1: reading and validation (torch-free, standard library).

A plan is what `ckptsim replay-plan SCENARIO -o plan.json` exports (replay/PLAN_AND_TRACE.md):
the scenario, the revision profiles it names, the initial params, and one entry per run (the
uninterrupted reference run, then one per phase) with every rank's local gradient at every
step. The runner never recomputes ckptsim's gradients; it replays these.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import model_parallel
from . import schedule as schedule_mod
from . import storage_faults as sf_mod
from . import trace_schema as ts

FORMAT = "ckptsim-replay-plan"
VERSION = 1
KINDS = ("fused_adam", "torch_adamw", "hybrid")
UPSTREAM_REPOS = ("NVIDIA/Megatron-LM", "radixark/Megatron-LM")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")


class PlanError(ValueError):
    """A plan that does not follow the schema; the message names the file and the field."""


def load_plan(path: str) -> Dict[str, Any]:
    """Reads and validates a plan file; raises PlanError naming the file and every problem."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            plan = json.load(f)
    except OSError as e:
        raise PlanError("%s: cannot read: %s" % (path, e)) from None
    except json.JSONDecodeError as e:
        raise PlanError("%s: not valid JSON: %s" % (path, e)) from None
    problems = validate_plan(plan)
    if problems:
        raise PlanError("%s: not a valid replay plan:\n  %s" % (path, "\n  ".join(problems)))
    return plan


def plan_paths(args: Sequence[str]) -> List[str]:
    """Expands plan arguments: a file is itself; a directory gives its *.json files, sorted."""
    out: List[str] = []
    for a in args:
        if os.path.isdir(a):
            out.extend(os.path.join(a, n) for n in sorted(os.listdir(a)) if n.endswith(".json"))
        else:
            out.append(a)
    return out


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def validate_plan(plan: Any) -> List[str]:
    """Every schema problem of a parsed plan, as "field: problem" strings ([] = valid)."""
    errs: List[str] = []

    def err(path: str, what: str) -> None:
        errs.append("%s: %s" % (path, what))

    if not isinstance(plan, dict):
        return ["<root>: a plan must be a JSON object"]
    allowed = {"format", "version", "scenario", "revisions", "initial_params", "runs", "generator"}
    for k in plan:
        if k not in allowed:
            err(k, "unknown field (expected one of: %s)" % ", ".join(sorted(allowed)))
    if plan.get("format") != FORMAT:
        err("format", "must be %r, got %r" % (FORMAT, plan.get("format")))
    if plan.get("version") != VERSION:
        err("version", "must be %d, got %r" % (VERSION, plan.get("version")))
    sc = plan.get("scenario")
    if not isinstance(sc, dict):
        err("scenario", "must be an object (the scenario file format)")
        return errs
    params = _validate_scenario(sc, err)
    revisions = plan.get("revisions")
    if not isinstance(revisions, dict) or not revisions:
        err("revisions", "must be a non-empty object: profile name -> {upstream, switches}")
        revisions = {}
    for name, rev in revisions.items():
        path = "revisions.%s" % name
        if not isinstance(rev, dict):
            err(path, "must be an object {upstream, switches}")
            continue
        for k in rev:
            if k not in ("upstream", "switches", "description"):
                err("%s.%s" % (path, k), "unknown field")
        up = rev.get("upstream", None)
        if up is not None:
            if not isinstance(up, dict) or set(up) - {"repo", "commit", "ref"} or "repo" not in up or "commit" not in up:
                err(path + ".upstream", "must be null or {repo, commit}")
            else:
                if up["repo"] not in UPSTREAM_REPOS:
                    err(path + ".upstream.repo", "must be one of %s, got %r" % (", ".join(UPSTREAM_REPOS), up["repo"]))
                if not isinstance(up["commit"], str) or not _SHA.match(up["commit"]):
                    err(path + ".upstream.commit", "must be 7-40 lowercase hex digits, got %r" % (up["commit"],))
        if not isinstance(rev.get("switches", {}), dict):
            err(path + ".switches", "must be an object")
    phases = sc.get("phases") if isinstance(sc.get("phases"), list) else []
    for i, ph in enumerate(phases):
        if isinstance(ph, dict) and isinstance(ph.get("revision"), str) and ph["revision"] not in revisions:
            err("scenario.phases[%d].revision" % i, "%r is not in 'revisions'" % ph["revision"])

    numel = {p["name"]: p["numel"] for p in params}
    total = sum(numel.values())
    ip = plan.get("initial_params")
    if not isinstance(ip, dict):
        err("initial_params", "must be an object: param name -> base64 float32")
    else:
        for name in numel:
            if name not in ip:
                err("initial_params.%s" % name, "is required (one entry per param)")
        for name, text in ip.items():
            if name not in numel:
                err("initial_params.%s" % name, "is not a param of the scenario")
                continue
            try:
                n = len(ts.decode_f32_bytes(text)) // 4
            except ValueError as e:
                err("initial_params.%s" % name, str(e))
                continue
            if n != numel[name]:
                err("initial_params.%s" % name, "holds %d floats, the param has %d" % (n, numel[name]))

    runs = plan.get("runs")
    if not isinstance(runs, list) or not runs:
        err("runs", "must be a non-empty array (the reference run, then one run per phase)")
        return errs
    _validate_runs(runs, phases, revisions, total, err)
    return errs


def _validate_scenario(sc: Dict[str, Any], err) -> List[Dict[str, Any]]:
    """Checks the fields the runner reads; returns the valid params (name, numel)."""
    if not isinstance(sc.get("name"), str) or not sc.get("name"):
        err("scenario.name", "must be a non-empty string (revisions and names resolved by ckptsim)")
    params = sc.get("params")
    good: List[Dict[str, Any]] = []
    if not isinstance(params, list) or not params:
        err("scenario.params", "must be a non-empty array of {name, numel, dtype}")
        params = []
    names = set()
    for i, p in enumerate(params):
        path = "scenario.params[%d]" % i
        if not isinstance(p, dict):
            err(path, "must be an object")
            continue
        name, numel, dtype = p.get("name"), p.get("numel"), p.get("dtype")
        ok = True
        if not isinstance(name, str) or not name or name in names:
            err(path + ".name", "must be a non-empty name used once, got %r" % (name,))
            ok = False
        if not isinstance(numel, int) or isinstance(numel, bool) or numel < 1:
            err(path + ".numel", "must be an integer >= 1, got %r" % (numel,))
            ok = False
        if dtype not in ("bf16", "fp32"):
            err(path + ".dtype", "must be \"bf16\" or \"fp32\", got %r" % (dtype,))
        for k in ("wd_mult", "lr_mult"):
            if k in p and (isinstance(p[k], bool) or not isinstance(p[k], (int, float)) or p[k] < 0):
                err("%s.%s" % (path, k), "must be a number >= 0, got %r" % (p[k],))
        problem = model_parallel.param_problem(p, path) if ok else None
        if problem:
            err(*problem)
        elif ok:
            names.add(name)
            good.append(p)
    o = sc.get("optimizer")
    if not isinstance(o, dict):
        err("scenario.optimizer", "must be an object")
    else:
        if o.get("kind") not in KINDS:
            err("scenario.optimizer.kind", "must be one of %s, got %r" % (", ".join(KINDS), o.get("kind")))
        for k in ("lr", "eps", "weight_decay"):
            if not ts.is_finite_number(o.get(k)):
                err("scenario.optimizer.%s" % k, "must be a number, got %r" % (o.get(k),))
        b = o.get("betas")
        if not isinstance(b, list) or len(b) != 2 or not all(ts.is_finite_number(x) for x in b):
            err("scenario.optimizer.betas", "must be [beta1, beta2], got %r" % (b,))
        if o.get("kind") == "hybrid" and not ts.is_finite_number(o.get("offload_fraction")):
            err("scenario.optimizer.offload_fraction", "is required for kind \"hybrid\"")
        te = o.get("transformer_engine", "installed")
        if te not in TE_PRESENCE:
            err("scenario.optimizer.transformer_engine", "must be \"installed\" or \"absent\", got %r" % (te,))
        elif te == "absent" and o.get("kind") != "hybrid":
            err("scenario.optimizer.transformer_engine", "applies only to kind \"hybrid\"")
        _validate_precision(o, err)
    bs = sc.get("bucket_size", None)
    if bs is not None and (not isinstance(bs, int) or isinstance(bs, bool) or bs < 1):
        err("scenario.bucket_size", "must be null or an integer >= 1, got %r" % (bs,))
    _validate_format(sc, "scenario", err)
    sps = sc.get("samples_per_step", 8)
    if not isinstance(sps, int) or isinstance(sps, bool) or sps < 1:
        err("scenario.samples_per_step", "must be an integer >= 1, got %r" % (sps,))
    phases = sc.get("phases")
    if not isinstance(phases, list) or not phases:
        err("scenario.phases", "must be a non-empty array of {dp, revision, steps}")
    else:
        for i, ph in enumerate(phases):
            path = "scenario.phases[%d]" % i
            if not isinstance(ph, dict):
                err(path, "must be an object")
                continue
            if not isinstance(ph.get("dp"), int) or isinstance(ph.get("dp"), bool) or ph["dp"] < 1:
                err(path + ".dp", "must be an integer >= 1, got %r" % (ph.get("dp"),))
            if not isinstance(ph.get("steps"), int) or isinstance(ph.get("steps"), bool) or ph["steps"] < 0:
                err(path + ".steps", "must be an integer >= 0, got %r" % (ph.get("steps"),))
            if not isinstance(ph.get("revision"), str) or not ph.get("revision"):
                err(path + ".revision", "must be a profile name")
            _validate_format(ph, path, err)
            try:
                sf_mod.parse_faults(ph, path)
            except sf_mod.StorageFaultSpecError as e:
                where, _, what = str(e).partition(": ")
                err(where, what)
            problem = model_parallel.phase_problem(good, ph, path) if len(good) == len(params) else None
            if problem:
                err(*problem)
            _validate_no_load_optim(phases, i, path, err)
            _validate_finetune(phases, i, path, err)
        problem = model_parallel.scenario_problem(good, phases, "scenario") if len(good) == len(params) else None
        if problem:
            err(*problem)
    schedule_mod.validate(sc, err)
    return good


STATE_DTYPES = ("fp32", "bf16", "fp16")  # optimizer.exp_avg_dtype, exp_avg_sq_dtype
MAIN_PARAMS_DTYPES = ("fp32",)  # optimizer.main_params_dtype
# Megatron accepts these, ckptsim does not model them (yet): why, per field.
NOT_MODELED = {
    "exp_avg_dtype": {"fp8": "FP8 states need TE's Float8Tensor"},
    "exp_avg_sq_dtype": {"fp8": "FP8 states need TE's Float8Tensor"},
    "main_params_dtype": {"fp16": "fp16 master weights (TE keeps them scaled, with their own scale)"},
}
_PRECISION_AWARE_WHERE = "precision_aware true, or kind \"hybrid\""


def _names(values: Sequence[str]) -> str:
    return ", ".join('"%s"' % v for v in values)


def is_precision_aware(o: Dict[str, Any]) -> bool:
    """OptimizerConfig.use_precision_aware_optimizer as the runner passes it: the scenario's
    precision_aware, and always for kind hybrid (Megatron's arguments require
    --use-precision-aware-optimizer with --optimizer-cpu-offload)."""
    return o.get("kind") == "hybrid" or o.get("precision_aware") is True


def _validate_precision(o: Dict[str, Any], err) -> None:
    """The precision-aware optimizer's fields of scenario.optimizer (issue 26, low-precision
    states): precision_aware, exp_avg_dtype, exp_avg_sq_dtype, main_params_dtype,
    store_param_remainders. A low-precision state or a remainders setting needs a precision-aware
    optimizer (Megatron asserts fp32 states without it: optimizer_config.py __post_init__)."""
    path = "scenario.optimizer."
    kind = o.get("kind")
    if "precision_aware" in o:
        pa = o["precision_aware"]
        if not isinstance(pa, bool):
            err(path + "precision_aware", "must be true or false, got %r" % (pa,))
        elif pa and kind == "torch_adamw":
            err(path + "precision_aware", "not with kind \"torch_adamw\" (Megatron builds torch AdamW only without "
                                          "TE, and --use-precision-aware-optimizer needs TE's FusedAdam), got true")
        elif not pa and kind == "hybrid":
            err(path + "precision_aware", "kind \"hybrid\" always runs precision-aware (Megatron's arguments "
                                          "require --use-precision-aware-optimizer with --optimizer-cpu-offload): "
                                          "leave it out or set it true, got false")
    aware = is_precision_aware(o)
    for key, allowed in (("exp_avg_dtype", STATE_DTYPES), ("exp_avg_sq_dtype", STATE_DTYPES),
                         ("main_params_dtype", MAIN_PARAMS_DTYPES)):
        if key not in o:
            continue
        value = o[key]
        why = NOT_MODELED[key].get(value) if isinstance(value, str) else None
        if why is not None:
            err(path + key, "%r is not modeled: %s (allowed: %s)" % (value, why, _names(allowed)))
        elif not isinstance(value, str) or value not in allowed:
            err(path + key, "must be one of %s, got %r" % (_names(allowed), value))
        elif value != "fp32" and not aware:
            err(path + key, "%r needs a precision-aware optimizer (%s); without it Megatron asserts \"fp32\""
                % (value, _PRECISION_AWARE_WHERE))
    if "store_param_remainders" in o:
        value = o["store_param_remainders"]
        if not isinstance(value, bool):
            err(path + "store_param_remainders", "must be true or false, got %r" % (value,))
        elif not aware:
            err(path + "store_param_remainders", "applies only to a precision-aware optimizer (%s), got %r"
                % (_PRECISION_AWARE_WHERE, value))


def optimizer_precision(plan_or_scenario: Dict[str, Any]) -> Dict[str, Any]:
    """The precision-aware settings of a valid plan's (or scenario's) optimizer, defaults filled:
    {"precision_aware": what the runner passes as use_precision_aware_optimizer, "exp_avg_dtype",
    "exp_avg_sq_dtype", "main_params_dtype" (names of STATE_DTYPES), "store_param_remainders"
    (OptimizerConfig's default true), "te_precision_aware": TE's FusedAdam itself holds the states
    in those dtypes (precision-aware kind fused_adam; the hybrid passes none of them to its
    sub-optimizers, hybrid_optimizer.py _init_sub_optimizers)}."""
    sc = plan_or_scenario.get("scenario", plan_or_scenario)
    o = sc["optimizer"]
    aware = is_precision_aware(o)
    return {"precision_aware": aware,
            "exp_avg_dtype": o.get("exp_avg_dtype", "fp32"),
            "exp_avg_sq_dtype": o.get("exp_avg_sq_dtype", "fp32"),
            "main_params_dtype": o.get("main_params_dtype", "fp32"),
            "store_param_remainders": bool(o.get("store_param_remainders", True)),
            "te_precision_aware": aware and o.get("kind") == "fused_adam"}


def _validate_resume_flag(phases: List[Any], i: int, path: str, err, flag: str) -> bool:
    """A phase's resume flag `flag` (no_load_optim, finetune), with ckptsim's scenario parser's
    rules (sim/scenario.cpp): a boolean; never in the first phase (it loads nothing); never in a
    scenario with storage_faults (the reference run restarts its optimizer where the phase's
    first step is planned, and after a storage fault the phase may resume elsewhere). Returns
    whether the flag is set and valid so far."""
    ph = phases[i]
    if flag not in ph:
        return False
    value, path = ph[flag], path + "." + flag
    if not isinstance(value, bool):
        err(path, "must be true or false, got %r" % (value,))
        return False
    if not value:
        return False
    if i == 0:
        err(path, "the first phase loads no checkpoint")
        return False
    if any(isinstance(p, dict) and p.get("storage_faults") for p in phases):
        err(path, "not modeled together with storage_faults (the fresh optimizer's reference needs the "
                  "phase to resume where the previous one ended)")
        return False
    return True


def _validate_no_load_optim(phases: List[Any], i: int, path: str, err) -> None:
    """A phase's no_load_optim (--no-load-optim)."""
    _validate_resume_flag(phases, i, path, err, "no_load_optim")


def _validate_finetune(phases: List[Any], i: int, path: str, err) -> None:
    """A phase's finetune (--finetune): no_load_optim's rules, and not a job of no steps that
    saves (train() makes no save at iteration 0, where such a job ends)."""
    if not _validate_resume_flag(phases, i, path, err, "finetune"):
        return
    ph = phases[i]
    saves = ph.get("save", True) is not False or bool(ph.get("save_interval"))
    if ph.get("steps") == 0 and saves:
        err(path + ".finetune", "a --finetune job of no steps ends at iteration 0, where the training loop makes "
                                "no save; give it steps or \"save\": false")


SHARDING_TYPES = ("dp_reshardable", "fully_reshardable", "dp_zero_gather_scatter", "fully_sharded_model_space")


def _validate_format(obj: Dict[str, Any], path: str, err) -> None:
    """sharding_type and fully_reshardable_mem_efficient of the scenario or of one phase."""
    if "sharding_type" in obj and obj["sharding_type"] not in SHARDING_TYPES:
        err(path + ".sharding_type", "must be one of %s, got %r" % (", ".join(SHARDING_TYPES), obj["sharding_type"]))
    mem = obj.get("fully_reshardable_mem_efficient", False)
    if not isinstance(mem, bool):
        err(path + ".fully_reshardable_mem_efficient", "must be true or false, got %r" % (mem,))


def phase_format(sc: Dict[str, Any], phase: int) -> Tuple[str, bool]:
    """The format phase `phase` saves in, as ckptsim's Scenario::format_of says: the phase's own
    sharding_type (with its mem_efficient, default false), else the scenario's."""
    ph = sc["phases"][phase]
    base = (sc.get("sharding_type", "dp_reshardable"), bool(sc.get("fully_reshardable_mem_efficient", False)))
    if "sharding_type" not in ph and "fully_reshardable_mem_efficient" not in ph:
        return base
    st = ph.get("sharding_type", base[0])
    default_mem = False if "sharding_type" in ph else base[1]
    return st, bool(ph.get("fully_reshardable_mem_efficient", default_mem))


def save_metadata(sc: Dict[str, Any], phase: int) -> Dict[str, Any]:
    """What megatron/training/checkpointing.py _build_sharded_state_dict_metadata() gives for
    the phase's format (without dp_cp_group), which the save also stores as content_metadata."""
    st, mem = phase_format(sc, phase)
    md: Dict[str, Any] = {"distrib_optim_sharding_type": st}
    if st == "fully_reshardable":
        md["distrib_optim_fully_reshardable_mem_efficient"] = mem
    md["singleton_local_shards"] = False
    md["chained_optim_avoid_prefix"] = True
    return md


def expected_runs(phases: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The run entries (without grads) a plan of these phases must have, in order."""
    if not phases:
        return []
    total = sum(int(p.get("steps", 0)) for p in phases)

    def sizes(p: Dict[str, Any]) -> Dict[str, Any]:  # a run names tp and pp where they are not 1
        return {k: p[k] for k in ("tp", "pp") if p.get(k, 1) != 1}

    out = [dict({"id": "reference", "dp": phases[0]["dp"], "revision": phases[0]["revision"], "start_step": 0,
                 "steps": total, "load": False, "save": False}, **sizes(phases[0]))]
    start = 0
    for k, p in enumerate(phases):
        out.append(dict({"id": "phase%d" % k, "phase": k, "dp": p["dp"], "revision": p["revision"],
                         "start_step": start, "steps": p["steps"], "load": k > 0,
                         "save": bool(p.get("save", True))}, **sizes(p)))
        start += p["steps"]
    return out


def _validate_runs(runs: List[Any], phases: List[Any], revisions: Dict[str, Any], total_numel: int, err) -> None:
    good_phases = [p for p in phases if isinstance(p, dict) and isinstance(p.get("dp"), int)
                   and isinstance(p.get("steps"), int) and isinstance(p.get("revision"), str)]
    want = expected_runs(good_phases) if len(good_phases) == len(phases) else []
    if want and len(runs) != len(want):
        err("runs", "must hold %d entries (reference + %d phases), got %d" % (len(want), len(phases), len(runs)))
    allowed = {"id", "phase", "dp", "tp", "pp", "revision", "start_step", "steps", "load", "save", "load_from",
               "grads", "grads_before"}
    ids = set()
    for i, run in enumerate(runs):
        path = "runs[%d]" % i
        if not isinstance(run, dict):
            err(path, "must be an object")
            continue
        for k in run:
            if k not in allowed:
                err("%s.%s" % (path, k), "unknown field")
        rid = run.get("id")
        if not isinstance(rid, str) or not rid or rid in ids:
            err(path + ".id", "must be a unique non-empty string, got %r" % (rid,))
        ids.add(rid)
        if run.get("revision") not in revisions:
            err(path + ".revision", "%r is not in 'revisions'" % (run.get("revision"),))
        if i < len(want):
            for k in set(want[i]) | ({"tp", "pp"} & set(run)):
                v = want[i].get(k, 1)
                if run.get(k, 1) != v:
                    err("%s.%s" % (path, k), "must be %r, got %r" % (v, run.get(k)))
        lf = run.get("load_from")
        if lf is not None and (lf not in ids or lf == rid):
            err(path + ".load_from", "must name an earlier run, got %r" % (lf,))
        dp, steps = run.get("dp"), run.get("steps")
        grads = run.get("grads")
        if not isinstance(dp, int) or not isinstance(steps, int):
            continue
        if not isinstance(grads, list) or len(grads) != steps:
            err(path + ".grads", "must hold one entry per step (%d), got %s"
                % (steps, len(grads) if isinstance(grads, list) else type(grads).__name__))
            continue
        before = run.get("grads_before")
        if before is not None:
            if not isinstance(before, list) or len(before) != run.get("start_step"):
                err(path + ".grads_before", "must hold one entry per global step before start_step (%r), got %s"
                    % (run.get("start_step"), len(before) if isinstance(before, list) else type(before).__name__))
                before = []
            grads = list(grads) + list(before)
        for k, per_rank in enumerate(grads):
            gpath = "%s.grads[%d]" % (path, k) if k < steps else "%s.grads_before[%d]" % (path, k - steps)
            if not isinstance(per_rank, list) or len(per_rank) != dp:
                err(gpath, "must hold one base64 array per DP rank (%d): its local gradient over the whole model" % dp)
                continue
            for r, text in enumerate(per_rank):
                try:
                    n = len(ts.decode_f32_bytes(text)) // 4
                except ValueError as e:
                    err("%s[%d]" % (gpath, r), str(e))
                    continue
                if n != total_numel:
                    err("%s[%d]" % (gpath, r), "holds %d floats, the params hold %d in all" % (n, total_numel))


# ---------------------------------------------------------------------------------------------
# Accessors used by the runner
# ---------------------------------------------------------------------------------------------
def scenario_name(plan: Dict[str, Any]) -> str:
    return plan["scenario"]["name"]


def params(plan: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The params in model order: [{name, numel, dtype, wd_mult, lr_mult, shape, tp_split, layer,
    expert}] with defaults filled (shape [numel], replicated, layer 0, not expert)."""
    out = []
    for p in plan["scenario"]["params"]:
        out.append({"name": p["name"], "numel": int(p["numel"]), "dtype": p["dtype"],
                    "wd_mult": float(p.get("wd_mult", 1.0)), "lr_mult": float(p.get("lr_mult", 1.0)),
                    "shape": model_parallel.global_shape(p), "tp_split": p.get("tp_split", "replicated"),
                    "layer": int(p.get("layer", 0)), "expert": model_parallel.is_expert(p)})
    return out


def run_by_id(plan: Dict[str, Any], run_id: str) -> Dict[str, Any]:
    for r in plan["runs"]:
        if r["id"] == run_id:
            return r
    raise KeyError(run_id)


def load_source(plan: Dict[str, Any], run_index: int) -> Optional[str]:
    """The id of the run whose checkpoint run `run_index` loads (None when it does not load):
    its "load_from", else the nearest earlier run with save=true other than the reference."""
    run = plan["runs"][run_index]
    if not run.get("load"):
        return None
    if run.get("load_from"):
        return run["load_from"]
    for prev in reversed(plan["runs"][:run_index]):
        if prev["id"] != "reference" and prev.get("save"):
            return prev["id"]
    return None


def step_gradients(run: Dict[str, Any], global_step: int) -> List[str]:
    """Every DP rank's local gradient (base64) at `global_step`: from the run's `grads` where the
    step is one of its planned steps, else from `grads_before` (global steps 1..start_step, in a
    plan with storage faults, where a phase may resume from an earlier iteration or from
    scratch). KeyError naming the step where the plan holds none."""
    start = int(run.get("start_step", 0))
    k = global_step - start - 1
    if 0 <= k < len(run["grads"]):
        return run["grads"][k]
    before = run.get("grads_before") or []
    if 1 <= global_step <= len(before):
        return before[global_step - 1]
    raise KeyError("run %s holds no gradient for global step %d (grads from %d, grads_before %d)"
                   % (run.get("id"), global_step, start + 1, len(before)))


def storage_faults(plan: Dict[str, Any], run: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The storage faults of the run's save: its phase's `storage_faults` (none for the reference)."""
    if "phase" not in run:
        return []
    phase = plan["scenario"]["phases"][int(run["phase"])]
    return [{"kind": f.kind, "file": f.file, "nth": f.nth}
            for f in sf_mod.parse_faults(phase, "scenario.phases[%d]" % int(run["phase"]))]


def has_storage_faults(plan: Dict[str, Any]) -> bool:
    """A plan in crash mode: every phase saves into and resumes from one checkpoint root."""
    return any(p.get("storage_faults") for p in plan["scenario"].get("phases", []) if isinstance(p, dict))


def rank_gradients(plan: Dict[str, Any], run: Dict[str, Any], rank: int) -> List[bytes]:
    """DP rank `rank`'s local gradient bytes (little-endian float32, every param concatenated in
    model order) for each step of the run."""
    return [ts.decode_f32_bytes(step[rank]) for step in run["grads"]]


def split_offsets(plan: Dict[str, Any]) -> List[Tuple[str, int, int]]:
    """(name, begin, end) of each param inside a concatenated gradient, in model order."""
    out, off = [], 0
    for p in params(plan):
        out.append((p["name"], off, off + p["numel"]))
        off += p["numel"]
    return out


TE_PRESENCE = ("installed", "absent")


def needs_te(plan: Dict[str, Any]) -> bool:
    """Whether the scenario's environment has TE (or apex): Megatron builds torch AdamW only
    without it, and a hybrid scenario says so in optimizer.transformer_engine."""
    o = plan["scenario"]["optimizer"]
    return o["kind"] != "torch_adamw" and o.get("transformer_engine", "installed") == "installed"


def module_order(names: Sequence[str]) -> Optional[List[str]]:
    """The order in which torch.nn.Module.named_parameters() yields params registered in this
    order by their dotted names (a submodule per dotted prefix, made when first needed): each
    module's own params in registration order, then its submodules' in creation order. None when
    the names do not form such a tree (an empty component, or a name that is both a param and a
    submodule)."""
    tree: Dict[str, Any] = {}  # component -> subtree (dict) or the full name (a param)
    for n in names:
        parts = n.split(".")
        if any(not c for c in parts):
            return None
        node = tree
        for c in parts[:-1]:
            node = node.setdefault(c, {})
            if not isinstance(node, dict):
                return None
        if parts[-1] in node:
            return None
        node[parts[-1]] = n

    def walk(node: Dict[str, Any]) -> List[str]:
        own = [v for v in node.values() if isinstance(v, str)]
        return own + [x for v in node.values() if isinstance(v, dict) for x in walk(v)]

    return walk(tree)


def unsupported_reason(plan: Dict[str, Any]) -> Optional[str]:
    """Why the real runner cannot replay this (valid) plan, or None. A dotted name is a param
    of submodules ("layers.0.qkv": module.layers, its submodule "0", param "qkv"), so the
    names must form a module tree whose parameter order is the scenario's (the buffers' layout
    follows it)."""
    names = [p["name"] for p in params(plan)]
    order = module_order(names)
    if order is None:
        return ("param names %s: the real replay registers a dotted name as a param of submodules, and these "
                "do not form a module tree (an empty component, or a name that is both a param and a "
                "submodule)" % ", ".join(repr(n) for n in names))
    if order != names:
        first = next(i for i, (a, b) in enumerate(zip(order, names)) if a != b)
        return ("param order: the real replay's module (a submodule per dotted prefix) yields %r at position %d "
                "where the scenario has %r; the buffers' layout follows the module's order, so put a module's own "
                "params before its submodules' and keep each submodule's params together" % (
                    order[first], first, names[first]))
    return None


def reduced_gradient(plan: Dict[str, Any], per_rank: Sequence[Sequence[float]]) -> List[float]:
    """The whole-model gradient that Megatron's reductions make of the DP ranks' local gradients
    `per_rank` (each over the whole model, as the plan holds them): a dense element summed over
    every DP rank (DDP's reduce-scatter over the DP group); an expert param's EP piece e summed
    over the expert-DP group of EP rank e only (its reduce-scatter over that group; every other
    rank's values there are never read: each rank writes only its own EP piece). Expert params
    are modeled at TP = PP = 1 only, so a DP rank is a world rank there."""
    out = [0.0] * (len(per_rank[0]) if per_rank else 0)
    for vals in per_rank:
        for e, x in enumerate(vals):
            out[e] += x
    ps = params(plan)
    if not any(p["expert"] for p in ps):
        return out
    dp = len(per_rank)
    ep = model_parallel.scenario_ep(plan["scenario"])
    for (name, b, _), p in zip(split_offsets(plan), ps):
        if not p["expert"]:
            continue
        for e in range(ep):
            group = model_parallel.expert_dp_group(e, ep, dp)
            for g, n in model_parallel.element_runs(p, 1, 0, ep, e):
                for x in range(b + g, b + g + n):
                    out[x] = sum(per_rank[r][x] for r in group)
    return out


def check_gradient_sums(plan: Dict[str, Any]) -> List[str]:
    """Every (global step, element) whose reduced gradient (reduced_gradient: summed over the
    ranks that reduce it) differs between the runs that take that step. Exact (float32 values
    summed in double); the dyadic gradients of ckptsim sum to the same total at any DP. Returns
    at most 10 problems."""
    out: List[str] = []
    totals: Dict[int, Tuple[str, List[float]]] = {}
    for run in plan["runs"]:
        for k, per_rank in enumerate(run["grads"]):
            step = run["start_step"] + k + 1
            acc = reduced_gradient(plan, [ts.decode_f32(text) for text in per_rank])
            if step not in totals:
                totals[step] = (run["id"], acc)
                continue
            ref_id, ref = totals[step]
            for e, (a, b) in enumerate(zip(ref, acc)):
                if a != b:
                    out.append("global step %d element %d: %s sums to %r, %s to %r" % (step, e, ref_id, a, run["id"], b))
                    break
            if len(out) >= 10:
                return out
    return out
