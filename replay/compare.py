"""Reading traces: summaries of step counters and errors, the step a resumed run should hold,
and the first divergence between two traces of the same plan (torch-free).

These are helpers for people and tests; the verdict-level comparison of a real trace with the
model's is `ckptsim conform` (C++).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import trace_schema as ts

EventKey = Tuple[str, int, str, int]  # (run id, rank, at, global_step)


def events_by_key(trace: Dict[str, Any]) -> Dict[EventKey, Dict[str, Any]]:
    """Every non-error event, keyed by (run id, rank, at, global_step)."""
    out: Dict[EventKey, Dict[str, Any]] = {}
    for run in trace["runs"]:
        for ev in run["events"]:
            if ev["at"] != "error":
                out[(run["id"], ev["rank"], ev["at"], ev["global_step"])] = ev
    return out


def errors(trace: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    return [(run["id"], ev) for run in trace["runs"] for ev in run["events"] if ev["at"] == "error"]


def first_error(trace: Dict[str, Any], primary_only: bool = True) -> Optional[Tuple[str, Dict[str, Any]]]:
    for rid, ev in errors(trace):
        if primary_only and ev.get("secondary"):
            continue
        return rid, ev
    return None


def _fmt_step(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def summarize(trace: Dict[str, Any]) -> List[str]:
    """Human-readable lines: per run, per event point, every part's step counter (and the t the
    last update used), and every error with its site and key path."""
    s = trace["setup"]
    lines = ["trace %s source=%s backend=%s gpus=%s te=%s fused_adam_standin=%s coalescing_workaround=%s torch=%s"
             % (trace["scenario"], trace["source"], s["backend"], s["gpus"], s["te"], s["fused_adam_standin"],
                s["coalescing_workaround"], s.get("torch"))]
    for rev, info in (trace.get("megatron") or {}).items():
        if info:
            lines.append("  megatron %s = %s@%s (%s)" % (rev, info.get("repo"), info.get("commit"), info.get("dir")))
    for run in trace["runs"]:
        head = "run %s dp=%d revision=%s status=%s" % (run["id"], run["dp"], run["revision"], run["status"])
        for k in ("backend", "te", "fused_adam_standin", "wall_s"):
            if k in run:
                head += " %s=%s" % (k, run[k])
        if run.get("skipped_reason"):
            head += " (%s)" % run["skipped_reason"]
        lines.append(head)
        for ev in run["events"]:
            if ev["at"] == "error":
                lines.append("  rank %d %s ERROR%s %s: %s [%s]%s" % (
                    ev["rank"], ev["stage"], " (secondary)" if ev.get("secondary") else "", ev["py_type"],
                    ev["message"][:300].replace("\n", " "), ev.get("site_line") or ev.get("site") or "-",
                    (" merge_path=(%s)" % ", ".join(ev["merge_path"])) if ev.get("merge_path") else ""))
                continue
            cells = []
            for p in ev["parts"]:
                c = "%s[%d:%d] %s step=%s" % (p["param"], p["range"][0], p["range"][1], p["part"], _fmt_step(p["step"]))
                if "chain" in p:  # the part's index in a chained optimizer of several parts
                    c = c.replace(" step=", " chain=%d step=" % p["chain"], 1)
                if p.get("step_used") is not None:
                    c += " used=%s" % _fmt_step(p["step_used"])
                cells.append(c)
            lines.append("  rank %d %-10s gs=%-3d %s" % (ev["rank"], ev["at"], ev["global_step"], "; ".join(cells)))
    return lines


def step_expectations(trace: Dict[str, Any]) -> List[Dict[str, Any]]:
    """For every part of every event of a resumed run (after_load, after_step): the counter it
    holds, and the counter an uninterrupted run holds at the same global step (the global step
    itself for every Adam part that has taken a step; ckptsim's step_matches_uninterrupted).
    Returns the rows where they differ."""
    rows = []
    for run in trace["runs"]:
        if not run.get("load"):
            continue
        for ev in run["events"]:
            if ev["at"] not in ("after_load", "after_step"):
                continue
            for p in ev["parts"]:
                want = ev["global_step"]
                if p["step"] is None or p["step"] != want:
                    rows.append({"run": run["id"], "rank": ev["rank"], "at": ev["at"], "global_step": want,
                                 "param": p["param"], "part": p["part"], "step": p["step"], "expected": want})
    return rows


def model_param_divergence(trace: Dict[str, Any], reference_id: str = "reference") -> List[Dict[str, Any]]:
    """Global steps at which a phase's model params (rank 0, after_step) hash differently from the
    uninterrupted reference run's at the same global step. Model params are whole params, so
    they compare across DP sizes."""
    evs = events_by_key(trace)
    out = []
    for run in trace["runs"]:
        if run["id"] == reference_id:
            continue
        for ev in run["events"]:
            if ev["at"] != "after_step" or ev["rank"] != 0:
                continue
            ref = evs.get((reference_id, 0, "after_step", ev["global_step"]))
            if ref is None:
                continue
            diff = sorted(n for n, h in ev["hashes"]["model_param"].items() if ref["hashes"]["model_param"].get(n) != h)
            if diff:
                out.append({"run": run["id"], "global_step": ev["global_step"], "params": diff})
    return out


def first_divergence(a: Dict[str, Any], b: Dict[str, Any], fields: Iterable[str] = ("status", "errors", "parts", "hashes")
                     ) -> Optional[Dict[str, Any]]:
    """The first place (run order, then event order of `a`) where two traces of the same plan
    differ: run status, the errors (type, stage, site, key path), a part's range or counters,
    or a hash. None when they agree on every compared field."""
    fields = set(fields)
    runs_b = {r["id"]: r for r in b["runs"]}
    for ra in a["runs"]:
        rb = runs_b.get(ra["id"])
        if rb is None:
            return {"run": ra["id"], "what": "run missing in b"}
        if "status" in fields and ra["status"] != rb["status"]:
            return {"run": ra["id"], "what": "status", "a": ra["status"], "b": rb["status"]}
        if "errors" in fields:
            ea = [_err_sig(e) for e in ra["events"] if e["at"] == "error" and not e.get("secondary")]
            eb = [_err_sig(e) for e in rb["events"] if e["at"] == "error" and not e.get("secondary")]
            if ea != eb:
                return {"run": ra["id"], "what": "errors", "a": ea, "b": eb}
        evb = {(e["rank"], e["at"], e["global_step"]): e for e in rb["events"] if e["at"] != "error"}
        for ev in ra["events"]:
            if ev["at"] == "error":
                continue
            key = (ev["rank"], ev["at"], ev["global_step"])
            other = evb.get(key)
            where = {"run": ra["id"], "rank": ev["rank"], "at": ev["at"], "global_step": ev["global_step"]}
            if other is None:
                return dict(where, what="event missing in b")
            if "parts" in fields:
                pa = {(p["param"], p["part"]): p for p in ev["parts"]}
                pb = {(p["param"], p["part"]): p for p in other["parts"]}
                if sorted(pa) != sorted(pb):
                    return dict(where, what="parts", a=sorted(pa), b=sorted(pb))
                for k in sorted(pa):
                    for f in ("range", "step", "step_used", "chain"):
                        if pa[k].get(f) != pb[k].get(f):
                            return dict(where, what="%s of %s (%s)" % (f, k[0], k[1]), a=pa[k].get(f), b=pb[k].get(f))
            if "hashes" in fields:
                for kind in ts.HASH_KINDS:
                    ha, hb = ev["hashes"][kind], other["hashes"][kind]
                    for n in sorted(set(ha) | set(hb)):
                        if ha.get(n) != hb.get(n):
                            return dict(where, what="%s hash of %s" % (kind, n), a=ha.get(n), b=hb.get(n))
    return None


def _err_sig(e: Dict[str, Any]) -> Tuple[Any, ...]:
    return (e["rank"], e["stage"], e["py_type"], e.get("site"), tuple(e.get("merge_path") or ()))
