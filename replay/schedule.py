"""The learning-rate and weight-decay schedule of a replayed run (torch-free, standard library).

A scenario's "schedule" (and a phase's own "schedule" and "opt_param_scheduler", sim/scenario.h)
are Megatron's arguments in iterations. This module turns them into what the runner builds:
the OptimizerParamScheduler's keyword arguments (iteration counts times the global batch size,
as megatron/training/training.py get_optimizer_param_scheduler does), each param group's
config override (a group with lr_mult m is {lr_mult: m, max_lr: lr*m, min_lr: min_lr*m},
as ckptsim builds it), and the schedule changes the uninterrupted reference run makes where a
later phase resumes with other arguments (the schedule Megatron's flags say should be in
force: ckptsim's sim::intended_schedules()), and where it restarts its optimizer and scheduler
(where a --no-load-optim phase resumes: reference_restarts).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")
WD_INCR_STYLES = ("constant", "linear", "cosine")
RESUMES = ("neither", "override", "use_checkpoint")

# The schedule fields a scenario spells, and the names this module keeps them under.
_FIELDS = {"lr": "lr", "min_lr": "min_lr", "lr_warmup_init": "lr_warmup_init",
           "lr_warmup_iters": "lr_warmup_iters", "lr_decay_iters": "lr_decay_iters",
           "lr_decay_style": "lr_decay_style", "start_weight_decay": "start_wd",
           "end_weight_decay": "end_wd", "weight_decay_incr_style": "wd_incr_style",
           "train_iters": "wd_incr_iters"}


def scenario_arguments(scenario: Dict[str, Any]) -> Dict[str, Any]:
    """The first phase's schedule arguments: constant at optimizer.lr and weight_decay unless
    the scenario's "schedule" says otherwise."""
    o = scenario["optimizer"]
    args = {"lr": float(o["lr"]), "min_lr": 0.0, "lr_warmup_init": 0.0, "lr_warmup_iters": 0,
            "lr_decay_iters": 1, "lr_decay_style": "constant", "start_wd": float(o["weight_decay"]),
            "end_wd": float(o["weight_decay"]), "wd_incr_iters": 1, "wd_incr_style": "constant"}
    return _overlay(args, scenario.get("schedule", {}))


def phase_arguments(scenario: Dict[str, Any], phase: int) -> Dict[str, Any]:
    """The schedule arguments phase `phase` starts its job with."""
    base = scenario_arguments(scenario)
    ph = scenario["phases"][phase]
    return _overlay(base, ph["schedule"]) if "schedule" in ph else base


def resume_flag(scenario: Dict[str, Any], phase: int) -> str:
    return scenario["phases"][phase].get("opt_param_scheduler", "neither")


def no_load_optim(scenario: Dict[str, Any], phase: int) -> bool:
    """Whether phase `phase` resumes with --no-load-optim (the model's params only)."""
    return bool(scenario["phases"][phase].get("no_load_optim", False))


def finetune(scenario: Dict[str, Any], phase: int) -> bool:
    """Whether phase `phase` resumes with --finetune (the model's params only, from iteration 0)."""
    return bool(scenario["phases"][phase].get("finetune", False))


def fresh_optimizer(scenario: Dict[str, Any], phase: int) -> bool:
    """Whether phase `phase`'s resume starts the optimizer and the scheduler afresh
    (--no-load-optim or --finetune): load_checkpoint() requests the model only."""
    return no_load_optim(scenario, phase) or finetune(scenario, phase)


def iteration_origins(scenario: Dict[str, Any]) -> List[int]:
    """Per phase, the global steps before its training loop's iteration 0: 0, or where the latest
    --finetune phase up to it resumed (ckptsim's sim::iteration_origins). A save of that phase at
    global step g names iteration g minus it."""
    out: List[int] = []
    done = 0
    for i, ph in enumerate(scenario["phases"]):
        out.append(0 if i == 0 else done if finetune(scenario, i) else out[-1])
        done += int(ph["steps"])
    return out


def resumed_iteration(scenario: Dict[str, Any], phase: int, checkpoint_iteration: int) -> Tuple[int, int]:
    """(the training loop's iteration, the phase's iteration origin) after phase `phase` loaded a
    checkpoint of `checkpoint_iteration`: the loop continues from it, or from 0 under --finetune
    (load_checkpoint(): "if args.finetune or release: iteration = 0"); the checkpoint's iteration
    counts from its saver's origin (the phase before: every phase with --finetune resumes where
    the previous one ended), so the global step is origin + iteration either way."""
    origins = iteration_origins(scenario)
    loaded_origin = origins[phase - 1] if 0 < phase <= len(origins) else 0
    iteration = 0 if 0 <= phase < len(origins) and finetune(scenario, phase) else int(checkpoint_iteration)
    return iteration, loaded_origin + int(checkpoint_iteration) - iteration


def intended_schedules(scenario: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per phase, the schedule that should be in force (the flags as Megatron documents them):
    the phase's own arguments, except after a --use-checkpoint-opt_param-scheduler resume,
    which keeps the schedule before it (all but lr_warmup_init, which no checkpoint holds).
    A --no-load-optim or --finetune phase loads no scheduler: its own arguments, whatever its flag."""
    out: List[Dict[str, Any]] = []
    for i in range(len(scenario["phases"])):
        args = phase_arguments(scenario, i)
        if i == 0 or fresh_optimizer(scenario, i) or resume_flag(scenario, i) != "use_checkpoint":
            out.append(args)
        else:
            kept = dict(out[-1])
            kept["lr_warmup_init"] = args["lr_warmup_init"]
            out.append(kept)
    return out


def reference_changes(scenario: Dict[str, Any]) -> List[Tuple[int, Dict[str, Any]]]:
    """(first global step, schedule) where the uninterrupted run's schedule changes."""
    intended = intended_schedules(scenario)
    out, first = [], 1
    for i, ph in enumerate(scenario["phases"]):
        if i > 0 and intended[i] != intended[i - 1]:
            out.append((first, intended[i]))
        first += int(ph["steps"])
    return out


def reference_restarts(scenario: Dict[str, Any]) -> List[int]:
    """The first global steps before which the uninterrupted run builds a new optimizer and
    scheduler: where each --no-load-optim phase resumes (1 + the steps of the phases before it),
    as ckptsim's reference run does (sim/driver.cpp run_reference). A scheduler built there
    counts from 0, so a later schedule change steps it by the steps done since."""
    out, first = [], 1
    for i, ph in enumerate(scenario["phases"]):
        if i > 0 and fresh_optimizer(scenario, i):
            out.append(first)
        first += int(ph["steps"])
    return out


def scheduler_kwargs(args: Dict[str, Any], samples_per_step: int, flag: str) -> Dict[str, Any]:
    """OptimizerParamScheduler's keyword arguments (after the optimizer)."""
    gbs = int(samples_per_step)
    return {"init_lr": args["lr_warmup_init"], "max_lr": args["lr"], "min_lr": args["min_lr"],
            "lr_warmup_steps": args["lr_warmup_iters"] * gbs, "lr_decay_steps": args["lr_decay_iters"] * gbs,
            "lr_decay_style": args["lr_decay_style"], "start_wd": args["start_wd"], "end_wd": args["end_wd"],
            "wd_incr_steps": args["wd_incr_iters"] * gbs, "wd_incr_style": args["wd_incr_style"],
            "use_checkpoint_opt_param_scheduler": flag == "use_checkpoint",
            "override_opt_param_scheduler": flag == "override"}


def group_override(wd_mult: float, lr_mult: float, args: Dict[str, Any]) -> Dict[str, float]:
    """The config override that makes a param group with these multipliers ({} for none)."""
    ov: Dict[str, float] = {}
    if wd_mult != 1.0:
        ov["wd_mult"] = wd_mult
    if lr_mult != 1.0:
        ov["lr_mult"] = lr_mult
        ov["max_lr"] = args["lr"] * lr_mult
        ov["min_lr"] = args["min_lr"] * lr_mult
    return ov


def _override_block_after_load(checkpointing_py: str) -> str:
    """The text of a training/checkpointing.py from its first --override-opt_param-scheduler test
    after the scheduler's load_state_dict() on ("" where it has none)."""
    load = checkpointing_py.find("opt_param_scheduler.load_state_dict(")
    if load < 0:
        return ""
    after = checkpointing_py[load:]
    override = after.find("override_opt_param_scheduler")
    return after[override:] if override >= 0 else ""


def reapplies_lr_bounds(checkpointing_py: str) -> bool:
    """Whether a training/checkpointing.py (its text) sets every param group's max_lr after the
    scheduler's load when --override-opt_param-scheduler is given (HEAD d98e8a64dd does; POST
    f4502eb1c9 and RX-MILES 2e64d788b do not)."""
    return 'param_group["max_lr"]' in _override_block_after_load(checkpointing_py)


def resets_num_steps(checkpointing_py: str) -> bool:
    """Whether that block also sets the scheduler's num_steps to args.consumed_train_samples
    (HEAD d98e8a64dd:3041 does, where they differ; POST and RX-MILES have no such block)."""
    block = _override_block_after_load(checkpointing_py)
    return "opt_param_scheduler.num_steps = args.consumed_train_samples" in block


def validate(scenario: Dict[str, Any], err) -> None:
    """Reports (through err(path, what)) schedule fields a plan cannot carry."""
    def check(obj: Any, path: str, with_lr: bool) -> None:
        if not isinstance(obj, dict):
            err(path, "must be an object")
            return
        for k, v in obj.items():
            if k not in _FIELDS or (k == "lr" and not with_lr):
                err("%s.%s" % (path, k), "unknown field")
            elif k.endswith("_style"):
                allowed = LR_DECAY_STYLES if k == "lr_decay_style" else WD_INCR_STYLES
                if v not in allowed:
                    err("%s.%s" % (path, k), "must be one of %s, got %r" % (", ".join(allowed), v))
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                err("%s.%s" % (path, k), "must be a number >= 0, got %r" % (v,))

    if "schedule" in scenario:
        check(scenario["schedule"], "scenario.schedule", False)
    for i, ph in enumerate(scenario.get("phases") or []):
        if not isinstance(ph, dict):
            continue
        if "schedule" in ph:
            check(ph["schedule"], "scenario.phases[%d].schedule" % i, True)
        if ph.get("opt_param_scheduler", "neither") not in RESUMES:
            err("scenario.phases[%d].opt_param_scheduler" % i,
                "must be one of %s, got %r" % (", ".join(RESUMES), ph.get("opt_param_scheduler")))


def _overlay(args: Dict[str, Any], fields: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(args)
    for k, v in fields.items():
        out[_FIELDS[k]] = v
    return out
