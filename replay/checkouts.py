"""Which Megatron-LM checkout runs which revision profile (torch-free).

The user names checkouts on the command line:
  --megatron DIR               one checkout for every revision of the plans
  --megatron REVISION=DIR      one per revision profile name (repeatable; wins over the above)
  --megatron-root ROOT         folders made by replay/fetch-megatron.sh: ROOT/<label>/ with a
                               CKPTSIM_UPSTREAM.json stamp {repo, commit}; a revision whose plan
                               entry names an upstream {repo, commit} gets the folder whose
                               stamp has the same repo and a commit that starts with it (or that
                               it starts with)
A checkout is a folder that holds megatron/core/ (a Megatron-LM clone, or an archive of
megatron/core). A revision that maps to no checkout is not replayed; its runs are reported
skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple

STAMP = "CKPTSIM_UPSTREAM.json"


class CheckoutError(ValueError):
    pass


def parse_megatron_args(values: Sequence[str]) -> Tuple[Optional[str], Dict[str, str]]:
    """Splits --megatron values into (the default DIR or None, {revision: DIR})."""
    default: Optional[str] = None
    per_rev: Dict[str, str] = {}
    for v in values:
        if "=" in v and not os.path.isdir(v):
            rev, _, d = v.partition("=")
            if not rev or not d:
                raise CheckoutError("--megatron %r: expected DIR or REVISION=DIR" % v)
            if rev in per_rev and per_rev[rev] != d:
                raise CheckoutError("--megatron: revision %r named twice (%s, %s)" % (rev, per_rev[rev], d))
            per_rev[rev] = d
        else:
            if default is not None and default != v:
                raise CheckoutError("--megatron: two default checkouts (%s, %s); name revisions with REVISION=DIR"
                                    % (default, v))
            default = v
    return default, per_rev


def is_checkout(d: str) -> bool:
    return os.path.isdir(os.path.join(d, "megatron", "core"))


def read_stamp(d: str) -> Optional[Dict[str, Any]]:
    p = os.path.join(d, STAMP)
    try:
        with open(p, "r", encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def scan_root(root: str) -> List[Tuple[str, Dict[str, Any]]]:
    """[(dir, stamp)] of the stamped checkouts directly under `root`, sorted by name."""
    out = []
    if not os.path.isdir(root):
        raise CheckoutError("--megatron-root %s: not a directory" % root)
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        s = read_stamp(d)
        if s is not None and is_checkout(d):
            out.append((d, s))
    return out


def _commit_matches(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return len(a) >= 7 and len(b) >= 7 and (a.startswith(b) or b.startswith(a))


def describe(d: str, plan_upstream: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """{repo, commit, dir, commit_source, label?} of a checkout: its stamp, else `git rev-parse
    HEAD` when it is a git work tree, else what the plan claims."""
    d = os.path.abspath(d)
    s = read_stamp(d)
    if s is not None and s.get("commit"):
        out = {"repo": s.get("repo"), "commit": s.get("commit"), "dir": d, "commit_source": "stamp"}
        if s.get("label"):
            out["label"] = s["label"]
        return out
    try:
        r = subprocess.run(["git", "-C", d, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return {"repo": (plan_upstream or {}).get("repo"), "commit": r.stdout.strip(), "dir": d,
                    "commit_source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    if plan_upstream:
        return {"repo": plan_upstream.get("repo"), "commit": plan_upstream.get("commit"), "dir": d,
                "commit_source": "plan"}
    return {"repo": None, "commit": None, "dir": d, "commit_source": "unknown"}


def resolve(revisions: Dict[str, Any], default: Optional[str], per_rev: Dict[str, str],
            root: Optional[str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Maps each revision name of `revisions` (plan "revisions") to a checkout dir.

    Returns ({revision: dir}, {revision: why it has none}). Precedence: REVISION=DIR, then the
    --megatron-root stamp that matches the revision's upstream commit, then the default DIR.
    Raises CheckoutError for a named folder that is not a checkout."""
    for rev, d in list(per_rev.items()) + ([("(default)", default)] if default else []):
        if not is_checkout(d):
            raise CheckoutError("--megatron %s%s: %s holds no megatron/core/"
                                % ("" if rev == "(default)" else rev + "=", d, d))
    stamped = scan_root(root) if root else []
    found: Dict[str, str] = {}
    missing: Dict[str, str] = {}
    for rev, info in revisions.items():
        if rev in per_rev:
            found[rev] = os.path.abspath(per_rev[rev])
            continue
        up = (info or {}).get("upstream")
        if up and stamped:
            hits = [d for d, s in stamped
                    if s.get("repo") == up.get("repo") and _commit_matches(str(s.get("commit", "")), str(up.get("commit", "")))]
            if hits:
                found[rev] = os.path.abspath(hits[0])
                continue
        if default:
            found[rev] = os.path.abspath(default)
            continue
        if up:
            missing[rev] = ("no checkout of %s@%s (give --megatron %s=DIR, or --megatron-root with that commit)"
                            % (up.get("repo"), up.get("commit"), rev))
        else:
            missing[rev] = ("profile %r names no upstream commit; give --megatron %s=DIR (e.g. the graft under review)"
                            % (rev, rev))
    return found, missing
