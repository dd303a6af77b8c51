"""A stand-in for `ckptsim replay-plan`: builds a valid replay plan for a scenario file with
simple deterministic gradients, so the runner can be smoke-tested before the C++ exporter exists.

    python -m replay.synthetic_plan SCENARIO.json [--revisions DIR] [-o plan.json]
           [--upstream REVISION=REPO@COMMIT ...]

THE GRADIENTS ARE NOT CKPTSIM'S. Real plans come from `ckptsim replay-plan`; a trace replayed
from a synthetic plan can be compared with itself (reference vs resumed runs, step counters,
exceptions) but not element by element with the model's trace. The plan says so in
"generator": {"tool": "replay.synthetic_plan", "synthetic": true}.

Values (all exact in float32, and the initial params exact in bf16):
  initial param i, element e:  k/64, k = ((seed + 31*i + 17*e) mod 65) - 32
  gradient at global step s:   g = k/64, k = ((7*s + 13*i + 5*e) mod 33) - 16   (the whole batch)
  rank r of dp gets            g * n_r / samples_per_step, where n_r counts the samples
                               s' in [0, samples_per_step) with s' mod dp == r (ckptsim's split)
so the ranks' local gradients sum to g exactly at any DP, and the reference run and a resumed
run see the same reduced gradient at every global step.

An expert param (`"expert": true`, at the scenario's EP size ep): rank r's local gradient is the
sum over the tokens of r's EP group (the ranks d*ep .. d*ep + ep - 1, d = r // ep, whose tokens
the MoE dispatch routes to r's experts), g * (n_{d*ep} + ... + n_{d*ep+ep-1}) / samples_per_step,
over the whole param (the rank takes its EP piece); Megatron reduces it over the expert-DP group
of r's EP rank only, {e, e + ep, ...}, which again sums to g exactly (plan.reduced_gradient).

Torch-free (standard library).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import plan as plan_mod
from . import trace_schema as ts

# Stopgap until every revision profile carries "upstream": {"repo", "commit"}: the commits the
# bundled profiles stand for (fidelity audit 2026-11-30 §0; upstream-pre-2874 is f4502eb1c9's
# real parent dceb1fb7ce, not the ae6707622e its profile names). A profile's own object form
# wins over this table; --upstream wins over both. Fix profiles name no commit: they are
# replayed only on a checkout named with --megatron REVISION=DIR.
KNOWN_UPSTREAM = {
    "upstream-pre-2874": ("NVIDIA/Megatron-LM", "dceb1fb7ce1d18c19c38815f3573180b6d527701"),
    "upstream-2874": ("NVIDIA/Megatron-LM", "f4502eb1c92f77e0ed190cac00293e8ac192543b"),
    "upstream-head": ("NVIDIA/Megatron-LM", "d98e8a64ddf34856e74b24714e3bedb2f5a39553"),
    "miles-main": ("radixark/Megatron-LM", "2e64d788b67fe8155774200c87606e1e449c494b"),
    "pr69-graft": ("radixark/Megatron-LM", "ef1b586f47720d59a4cc7475da73ca9f7c434ca1"),
}


def initial_value(seed: int, i: int, e: int) -> float:
    return float(((seed + 31 * i + 17 * e) % 65) - 32) / 64.0


def batch_gradient(step: int, i: int, e: int) -> float:
    return float(((7 * step + 13 * i + 5 * e) % 33) - 16) / 64.0


def samples_on_rank(samples_per_step: int, dp: int, rank: int) -> int:
    return len(range(rank, samples_per_step, dp))


def samples_of_ep_group(samples_per_step: int, dp: int, ep: int, rank: int) -> int:
    """The samples of the EP group of DP rank `rank` (TP = PP = 1): the ranks d*ep .. d*ep+ep-1,
    d = rank // ep."""
    first = (rank // ep) * ep
    return sum(samples_on_rank(samples_per_step, dp, r) for r in range(first, first + ep))


def _load_profiles(dirs: List[str]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for d in dirs:
        if not os.path.isdir(d):
            continue
        for n in sorted(os.listdir(d)):
            if n.endswith(".json"):
                with open(os.path.join(d, n), "r", encoding="utf-8") as f:
                    prof = json.load(f)
                out[prof.get("name", n[:-5])] = prof
    return out


def _load_profile_file(path: str) -> Dict[str, Any]:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def _switches(name: str, profiles: Dict[str, Dict[str, Any]], seen: Tuple[str, ...] = ()) -> Dict[str, Any]:
    prof = profiles[name]
    base: Dict[str, Any] = {}
    parent = prof.get("extends")
    if parent:
        if parent in seen:
            raise ValueError("revision profile %r: 'extends' loops through %r" % (name, parent))
        base = _switches(parent, profiles, seen + (name,))
    base.update(prof.get("switches", {}))
    return base


def _upstream(name: str, prof: Dict[str, Any], overrides: Dict[str, Tuple[str, str]]) -> Optional[Dict[str, str]]:
    if name in overrides:
        repo, commit = overrides[name]
        return {"repo": repo, "commit": commit}
    up = prof.get("upstream")
    if isinstance(up, dict) and up.get("repo") and up.get("commit"):
        return {"repo": up["repo"], "commit": up["commit"]}
    if name in KNOWN_UPSTREAM:
        repo, commit = KNOWN_UPSTREAM[name]
        return {"repo": repo, "commit": commit}
    if isinstance(up, str) and "@" in up:
        repo, _, commit = up.partition("@")
        if repo in plan_mod.UPSTREAM_REPOS:
            return {"repo": repo, "commit": commit.lower()}
    return None


def build_plan(scenario: Dict[str, Any], scenario_path: str, profiles: Dict[str, Dict[str, Any]],
               overrides: Optional[Dict[str, Tuple[str, str]]] = None) -> Dict[str, Any]:
    """The synthetic plan of a parsed scenario (see the module docstring)."""
    overrides = overrides or {}
    sc = json.loads(json.dumps(scenario))  # deep copy
    if not sc.get("name"):
        sc["name"] = os.path.splitext(os.path.basename(scenario_path))[0]
    revisions: Dict[str, Any] = {}
    for ph in sc["phases"]:
        rev = ph["revision"]
        if rev.endswith(".json"):
            p = rev if os.path.isabs(rev) else os.path.join(os.path.dirname(scenario_path), rev)
            prof = _load_profile_file(p)
            profiles = dict(profiles)
            profiles[prof["name"]] = prof
            rev = prof["name"]
            ph["revision"] = rev
        if rev not in profiles:
            raise ValueError("%s: revision %r: no such profile" % (scenario_path, rev))
        if rev not in revisions:
            revisions[rev] = {"upstream": _upstream(rev, profiles[rev], overrides),
                              "switches": _switches(rev, profiles)}
    seed = int(sc.get("seed", 0))
    sps = int(sc.get("samples_per_step", 8))
    params = sc["params"]
    initial = {}
    for i, p in enumerate(params):
        initial[p["name"]] = ts.encode_f32(initial_value(seed, i, e) for e in range(int(p["numel"])))
    ep = int(sc["phases"][0].get("ep", 1)) if sc.get("phases") else 1
    expert = [p.get("expert", False) is True for p in params for _ in range(int(p["numel"]))]
    runs = plan_mod.expected_runs(sc["phases"])
    for run in runs:
        grads = []
        for k in range(run["steps"]):
            step = run["start_step"] + k + 1
            batch = [batch_gradient(step, i, e) for i, p in enumerate(params) for e in range(int(p["numel"]))]
            per_rank = []
            for r in range(run["dp"]):
                frac = samples_on_rank(sps, run["dp"], r) / float(sps)
                frac_ep = samples_of_ep_group(sps, run["dp"], ep, r) / float(sps) if run["dp"] % ep == 0 else frac
                per_rank.append(ts.encode_f32(g * (frac_ep if x else frac) for g, x in zip(batch, expert)))
            grads.append(per_rank)
        run["grads"] = grads
    return {"format": plan_mod.FORMAT, "version": plan_mod.VERSION,
            "generator": {"tool": "replay.synthetic_plan", "synthetic": True,
                          "note": "gradients are not ckptsim's; real plans come from `ckptsim replay-plan`"},
            "scenario": sc, "revisions": revisions, "initial_params": initial, "runs": runs}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replay.synthetic_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", help="scenario files (ckptsim's scenario format)")
    ap.add_argument("--revisions", action="append", default=None,
                    help="folder of revision profiles (default: revisions/ of this checkout)")
    ap.add_argument("-o", "--out", help="plan file (one scenario) ")
    ap.add_argument("--out-dir", help="folder for <scenario>.plan.json (several scenarios)")
    ap.add_argument("--upstream", action="append", default=[], metavar="REVISION=REPO@COMMIT",
                    help="the upstream commit a revision stands for (wins over the profile)")
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = a.revisions or [os.path.join(here, "revisions")]
    profiles = _load_profiles(dirs)
    overrides: Dict[str, Tuple[str, str]] = {}
    for u in a.upstream:
        rev, _, rc = u.partition("=")
        repo, _, commit = rc.partition("@")
        if not rev or not repo or not commit:
            ap.error("--upstream %r: expected REVISION=REPO@COMMIT" % u)
        overrides[rev] = (repo, commit.lower())
    if len(a.scenarios) > 1 and not a.out_dir:
        ap.error("several scenarios need --out-dir")
    for path in a.scenarios:
        with open(path, "r", encoding="utf-8") as f:
            sc = json.load(f)
        plan = build_plan(sc, path, profiles, overrides)
        problems = plan_mod.validate_plan(plan)
        if problems:
            print("%s: the synthetic plan is invalid:\n  %s" % (path, "\n  ".join(problems)), file=sys.stderr)
            return 3
        if a.out_dir:
            os.makedirs(a.out_dir, exist_ok=True)
            out = os.path.join(a.out_dir, plan["scenario"]["name"] + ".plan.json")
        else:
            out = a.out
        text = json.dumps(plan, indent=1)
        if out:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
            print("%s -> %s (%d runs)" % (path, out, len(plan["runs"])))
        else:
            sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
