"""`python -m replay ...`: the replay runner's command line (torch-free; only the worker
processes that `run` starts import torch and megatron).

  run             replay plans on real Megatron-LM checkouts, write traces
  validate-plan   check plan files against the schema (and, with --check-grads, that every run's
                  gradients sum to the same total at every global step)
  validate-trace  check trace files against the schema
  summarize       print a trace's step counters and errors, run by run
  diff            the first place two traces of the same plan differ
  synthetic-plan  build a smoke-test plan from a scenario file (not ckptsim's gradients)
  serve           a long-running runner: one plan per request (JSON lines on stdin, answers on
                  stdout; warm worker pools shared by every request; replay/serve.py)

Exit status: 0 done (for `run`: every trace written, whatever the replayed code did; for
`serve`: told to exit, or stdin ended), 1 `validate-*` found problems / `diff` found a difference,
2 bad input, 3 a bug of the runner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

from . import checkouts as co
from . import checkpoint_layout as layout
from . import compare
from . import plan as plan_mod
from . import model_parallel
from . import trace_schema as ts


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m replay", description="Replay ckptsim scenarios on real Megatron-LM.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="replay plans on real Megatron-LM checkouts and write traces")
    r.add_argument("--plan", action="append", required=True, metavar="PLAN",
                   help="a plan file (from `ckptsim replay-plan`) or a folder of them; repeatable")
    out = r.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", metavar="TRACE", help="the trace file (one plan)")
    out.add_argument("--out-dir", metavar="DIR", help="folder for <scenario>.trace.json (any number of plans)")
    add_replay_options(r)
    r.add_argument("--check-grads", action="store_true",
                   help="before running, check that each global step's gradients sum to the same total in every run")
    r.add_argument("--dry-run", action="store_true", help="validate the plans and print which checkout runs what")
    r.add_argument("--resume-from", action="append", default=[], metavar="[RUN=]DIR",
                   help="run RUN (default: each plan's first run that loads) loads the checkpoint directory DIR "
                        "(latest_checkpointed_iteration.txt + iter_NNNNNNN/, e.g. from `ckptsim run "
                        "--checkpoint-format torch_dist`) instead of the earlier run's save; {scenario} in DIR is "
                        "the plan's scenario name; repeatable")
    r.add_argument("--no-prestart", action="store_true",
                   help="start a checkout's workers only when a run needs them (default: start all at once, "
                        "so their imports overlap)")

    add_serve_arguments(sub.add_parser("serve", help="a long-running runner: replays one plan per request read "
                                                     "from stdin (JSON lines; see replay/PLAN_AND_TRACE.md)"))

    v = sub.add_parser("validate-plan", help="check plan files")
    v.add_argument("plans", nargs="+")
    v.add_argument("--check-grads", action="store_true")

    t = sub.add_parser("validate-trace", help="check trace files")
    t.add_argument("traces", nargs="+")

    s = sub.add_parser("summarize", help="print step counters and errors of traces")
    s.add_argument("traces", nargs="+")
    s.add_argument("--steps", action="store_true", help="also list the resumed counters that differ from the global step")

    d = sub.add_parser("diff", help="first divergence between two traces of the same plan")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--fields", default="status,errors,parts,hashes")

    sub.add_parser("synthetic-plan", help="build a smoke-test plan (see python -m replay.synthetic_plan -h)",
                   add_help=False)
    return ap


def add_replay_options(p: argparse.ArgumentParser) -> None:
    """The options `run` and `serve` share: the checkouts, how runs are set up, and the limits.
    Both subparsers call this (and `serve`'s own parser, see replay/serve.py), so the two cannot
    drift; each turns the parsed values into Coordinator opts with coordinator_opts()."""
    p.add_argument("--megatron", action="append", default=[], metavar="DIR|REVISION=DIR",
                   help="a checkout holding megatron/core for every revision, or for one revision profile")
    p.add_argument("--megatron-root", metavar="ROOT",
                   help="folder of checkouts made by replay/fetch-megatron.sh, matched by upstream commit")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="auto: NCCL with one GPU per rank where there are enough GPUs, else gloo on shared GPUs "
                        "with the coalescing workaround (default: %(default)s)")
    p.add_argument("--emulate-te", action="store_true",
                   help="Transformer Engine absent: take Megatron's TE code branches anyway (labelled in the trace)")
    p.add_argument("--fused-adam-standin", action="store_true",
                   help="TE absent: inject the stand-in FusedAdam (TE's documented semantics) where TE's would be "
                        "built (labelled in the trace); needs --emulate-te")
    p.add_argument("--values", action="store_true", help="also write every hashed array (base64 float32)")
    p.add_argument("--work-dir", help="checkpoints, process-group stores and worker logs (default: a new temp folder)")
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("--collective-timeout", type=float, default=120.0, metavar="S",
                   help="torch.distributed timeout of each run's process group (default: %(default)s)")
    p.add_argument("--abort-grace", type=float, default=15.0, metavar="S",
                   help="after a rank fails, how long the other ranks may still run (default: %(default)s)")
    p.add_argument("--run-timeout", type=float, default=900.0, metavar="S",
                   help="wall-clock limit of one run (default: %(default)s)")
    p.add_argument("--python", help="interpreter for the worker processes (default: this one)")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """`serve`'s options: the shared ones and its own two."""
    add_replay_options(p)
    p.add_argument("--prestart-dp", type=int, default=0, metavar="N",
                   help="after the hello, start N workers of every checkout named by --megatron, so that their "
                        "imports overlap the first request (default: %(default)s)")
    p.add_argument("--device-offset", type=int, default=0, metavar="K",
                   help="rank r of every run uses CUDA device (K + r) %% GPUs, to spread several servers over "
                        "the GPUs of one host (default: %(default)s)")


FUSED_ADAM_STANDIN_NEEDS_EMULATE_TE = ("--fused-adam-standin needs --emulate-te (the stand-in is built where Megatron "
                                       "builds TE's FusedAdam)")
NAME_A_CHECKOUT = "name a checkout: --megatron DIR, --megatron REVISION=DIR or --megatron-root ROOT"


def coordinator_opts(a: argparse.Namespace, work: str, argv: Sequence[str]) -> Dict[str, Any]:
    """The Coordinator opts of the options add_replay_options() defines (the caller adds its own)."""
    return {
        "work_dir": work, "backend": a.backend, "emulate_te": a.emulate_te, "fused_adam_standin": a.fused_adam_standin,
        "values": a.values, "keep_checkpoints": a.keep_checkpoints, "collective_timeout_s": a.collective_timeout,
        "abort_grace_s": a.abort_grace, "run_timeout_s": a.run_timeout, "python": a.python, "argv": list(argv),
    }


def _read_json(path: str) -> Any:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def cmd_validate_plan(a: argparse.Namespace) -> int:
    bad = 0
    for p in plan_mod.plan_paths(a.plans):
        try:
            plan = plan_mod.load_plan(p)
        except plan_mod.PlanError as e:
            print(e)
            bad += 1
            continue
        probs = plan_mod.check_gradient_sums(plan) if a.check_grads else []
        if probs:
            print("%s: gradients do not sum alike:\n  %s" % (p, "\n  ".join(probs)))
            bad += 1
        else:
            print("%s: ok (%s, %d runs)" % (p, plan_mod.scenario_name(plan), len(plan["runs"])))
    return 1 if bad else 0


def cmd_validate_trace(a: argparse.Namespace) -> int:
    bad = 0
    for p in a.traces:
        try:
            tr = _read_json(p)
        except (OSError, ValueError) as e:
            print("%s: cannot read: %s" % (p, e))
            bad += 1
            continue
        probs = ts.validate_trace(tr)
        for run in (tr.get("runs") or []) if isinstance(tr, dict) else []:
            for ev in run.get("events", []) if isinstance(run, dict) else []:
                if isinstance(ev, dict) and "values" in ev and not probs:
                    probs.extend(ts.check_values_match_hashes(ev))
        if probs:
            print("%s: %d problems:\n  %s" % (p, len(probs), "\n  ".join(probs[:50])))
            bad += 1
        else:
            print("%s: ok" % p)
    return 1 if bad else 0


def cmd_summarize(a: argparse.Namespace) -> int:
    for p in a.traces:
        tr = _read_json(p)
        print("\n".join(compare.summarize(tr)))
        if a.steps:
            rows = compare.step_expectations(tr)
            print("resumed counters that differ from the global step: %d" % len(rows))
            for row in rows[:40]:
                print("  %(run)s rank %(rank)d %(at)s gs=%(global_step)d %(param)s %(part)s: step=%(step)s "
                      "(uninterrupted: %(expected)s)" % row)
            for d in compare.model_param_divergence(tr):
                print("  model params differ from the reference: %(run)s at global step %(global_step)d: %(params)s" % d)
    return 0


def cmd_diff(a: argparse.Namespace) -> int:
    d = compare.first_divergence(_read_json(a.a), _read_json(a.b), fields=a.fields.split(","))
    if d is None:
        print("no difference in %s" % a.fields)
        return 0
    print(json.dumps(d, indent=1))
    return 1


def _load_plans(paths: Sequence[str]) -> List[tuple]:
    out = []
    for p in plan_mod.plan_paths(paths):
        out.append((p, plan_mod.load_plan(p)))
    if not out:
        raise plan_mod.PlanError("no plan files in %s" % ", ".join(paths))
    return out


def cmd_run(a: argparse.Namespace, argv: Sequence[str]) -> int:
    if a.fused_adam_standin and not a.emulate_te:
        print(FUSED_ADAM_STANDIN_NEEDS_EMULATE_TE, file=sys.stderr)
        return 2
    try:
        plans = _load_plans(a.plan)
        default, per_rev = co.parse_megatron_args(a.megatron)
        if not default and not per_rev and not a.megatron_root:
            raise co.CheckoutError(NAME_A_CHECKOUT)
    except (plan_mod.PlanError, co.CheckoutError) as e:
        print(e, file=sys.stderr)
        return 2
    if a.out and len(plans) != 1:
        print("--out takes one plan; %d given: use --out-dir" % len(plans), file=sys.stderr)
        return 2
    if a.check_grads:
        for p, plan in plans:
            probs = plan_mod.check_gradient_sums(plan)
            if probs:
                print("%s: gradients do not sum alike:\n  %s" % (p, "\n  ".join(probs)), file=sys.stderr)
                return 2
    try:
        resume_specs = layout.parse_resume_from(a.resume_from)
        resumes = [layout.resume_dirs_for(plan, resume_specs) for _, plan in plans]
    except layout.LayoutError as e:
        print(e, file=sys.stderr)
        return 2
    mappings = []
    for p, plan in plans:
        try:
            found, missing = co.resolve(plan["revisions"], default, per_rev, a.megatron_root)
        except co.CheckoutError as e:
            print(e, file=sys.stderr)
            return 2
        mappings.append((found, missing))
        print("%s: %s" % (p, plan_mod.scenario_name(plan)))
        for rev in plan["revisions"]:
            print("  %-18s %s" % (rev, found.get(rev) or "NOT REPLAYED: " + missing.get(rev, "?")))
    if a.dry_run:
        return 0
    from .coordinator import Coordinator

    work = a.work_dir or tempfile.mkdtemp(prefix="ckptsim-replay-")
    os.makedirs(work, exist_ok=True)
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
    coord = Coordinator(coordinator_opts(a, work, argv))
    print("work dir %s (worker logs in %s/logs)" % (work, work))
    t0 = time.time()
    try:
        if not a.no_prestart:
            need: Dict[str, int] = {}
            for (p, plan), (found, missing) in zip(plans, mappings):
                if plan_mod.unsupported_reason(plan):
                    continue
                for run in plan["runs"]:
                    d = found.get(run["revision"])
                    if d:
                        need[d] = max(need.get(d, 0), model_parallel.world_size(run))
            for d, n in sorted(need.items()):
                coord.prestart(d, n)
        for (p, plan), (found, missing), resume in zip(plans, mappings, resumes):
            print("replaying %s" % plan_mod.scenario_name(plan), flush=True)
            trace = coord.replay_plan(p, plan, found, missing, resume)
            probs = ts.validate_trace(trace)
            if probs:
                print("internal error: the trace of %s breaks the schema:\n  %s" % (p, "\n  ".join(probs[:20])),
                      file=sys.stderr)
            out = a.out or os.path.join(a.out_dir, plan_mod.scenario_name(plan) + ".trace.json")
            with open(out, "w", encoding="utf-8") as f:
                json.dump(trace, f, indent=1)
                f.write("\n")
            print("  -> %s" % out, flush=True)
            if probs:
                return 3
    finally:
        coord.close()
    print("done in %.1f s" % (time.time() - t0))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "synthetic-plan":
        from . import synthetic_plan

        return synthetic_plan.main(argv[1:])
    if argv and argv[0] == "serve":
        # Its own parser, so that a bad argument is answered on stdout too (a hello with ok false).
        from . import serve

        return serve.main(argv[1:])
    a = build_parser().parse_args(argv)
    if a.cmd == "run":
        return cmd_run(a, argv)
    if a.cmd == "validate-plan":
        return cmd_validate_plan(a)
    if a.cmd == "validate-trace":
        return cmd_validate_trace(a)
    if a.cmd == "summarize":
        return cmd_summarize(a)
    if a.cmd == "diff":
        return cmd_diff(a)
    return 2
