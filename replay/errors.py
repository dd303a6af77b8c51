"""Turning a Python exception raised inside Megatron into a trace error event (torch-free).

The site is the innermost traceback frame whose file lies inside a `megatron/` (or
`miles_megatron_plugins/`) folder: "dict_utils.py merge()", the format ckptsim's model uses,
plus "site_line" with the path from that folder and the line ("megatron/core/dist_checkpointing/
dict_utils.py:237"). A method of the FusedAdam stand-in (replay/emulation.py StandinFusedAdam)
counts as the frame of TE's FusedAdam it stands for, named as the model names TE's frames:
"fused_adam.py FusedAdam.set_scaled_state()", site_line "transformer_engine/pytorch/optimizers/
fused_adam.py (stand-in: replay/emulation.py:LINE)"; without it, an assert the stand-in copies
from TE would be placed at the Megatron frame that called it. For an error raised by dist_checkpointing's merge(), the key path is read
from the `key` local of the innermost merge() frame and written as Python reprs, one string per
key: ["'optimizer'", "'param_state'", "0", "(torch.bfloat16, torch.float32)", "0", "0", "'step'"].
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple

_PACKAGE_DIRS = ("megatron", "miles_megatron_plugins")
MESSAGE_MAX = 4000
TRACEBACK_MAX = 6000


def _package_relative(filename: str) -> Optional[str]:
    """'megatron/core/x.py' for a file inside a megatron (or plugins) package folder, else None."""
    parts = os.path.normpath(filename).replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _PACKAGE_DIRS:
            # The innermost 'megatron' component: megatron/core/... (also inside site-packages).
            return "/".join(parts[i:])
    return None


def _frames(tb: Optional[TracebackType]) -> List[Tuple[Any, int]]:
    return list(traceback.walk_tb(tb))


STANDIN_FILE = "replay/emulation.py"
STANDIN_CLASS = "StandinFusedAdam"
TE_FUSED_ADAM = "transformer_engine/pytorch/optimizers/fused_adam.py"


def _standin_method(frame: Any) -> Optional[str]:
    """The method name when `frame` runs a method of the FusedAdam stand-in, else None."""
    code = frame.f_code
    if not code.co_filename.replace("\\", "/").endswith(STANDIN_FILE):
        return None
    qualname = getattr(code, "co_qualname", code.co_name)  # Python >= 3.11 has co_qualname
    prefix = STANDIN_CLASS + "."
    if not qualname.startswith(prefix) or "." in qualname[len(prefix):]:
        return None
    return qualname[len(prefix):]


class TrainingLoopError(RuntimeError):
    """An error the runner raises where the training loop (megatron/training/, which the runner
    does not import) raises it: `site` and `site_line` name the training loop's own frame, and
    the event's py_type is the training loop's (RuntimeError)."""

    py_type = "RuntimeError"

    def __init__(self, message: str, site: str, site_line: Optional[str]) -> None:
        super().__init__(message)
        self.site, self.site_line = site, site_line


def upstream_site(exc: BaseException) -> Tuple[str, Optional[str]]:
    """("file.py function()", "megatron/.../file.py:LINE") of the innermost Megatron frame, or
    ("", None) when no frame of the traceback lies in Megatron (a TrainingLoopError: its own)."""
    if isinstance(exc, TrainingLoopError):
        return exc.site, exc.site_line
    best = None
    for frame, lineno in _frames(exc.__traceback__):
        rel = _package_relative(frame.f_code.co_filename)
        if rel is not None:
            best = ("%s %s()" % (os.path.basename(rel), frame.f_code.co_name), "%s:%d" % (rel, lineno))
            continue
        method = _standin_method(frame)
        if method is not None:
            best = ("%s FusedAdam.%s()" % (os.path.basename(TE_FUSED_ADAM), method),
                    "%s (stand-in: %s:%d)" % (TE_FUSED_ADAM, STANDIN_FILE, lineno))
    return best if best is not None else ("", None)


def merge_path(exc: BaseException) -> Tuple[Optional[List[str]], Optional[str]]:
    """(key path as reprs, kind) when `exc` was raised by dist_checkpointing's merge(), else
    (None, None). kind: "duplicate_leaf" or "list_length_mismatch"."""
    key = None
    for frame, _ in _frames(exc.__traceback__):
        code = frame.f_code
        if code.co_name == "merge" and code.co_filename.replace("\\", "/").endswith("dict_utils.py"):
            if "key" in frame.f_locals:
                key = frame.f_locals["key"]
    if key is None or not isinstance(exc, ValueError):
        return None, None
    msg = str(exc)
    if msg.startswith("Duplicate non-dict and non-list values"):
        kind = "duplicate_leaf"
    elif msg.startswith("Cannot merge two lists with different lengths"):
        kind = "list_length_mismatch"
    else:
        kind = None
    try:
        path = [repr(k) for k in key]
    except TypeError:
        path = [repr(key)]
    return path, kind


def error_event(exc: BaseException, rank: int, stage: str, global_step: Optional[int] = None,
                with_traceback: bool = True) -> Dict[str, Any]:
    """The trace error event for an exception a rank raised in `stage`."""
    site, site_line = upstream_site(exc)
    mpath, mkind = merge_path(exc)
    message = str(exc)
    if len(message) > MESSAGE_MAX:
        message = message[:MESSAGE_MAX] + "... [%d more characters]" % (len(str(exc)) - MESSAGE_MAX)
    ev: Dict[str, Any] = {
        "rank": rank,
        "at": "error",
        "stage": stage,
        "py_type": exc.py_type if isinstance(exc, TrainingLoopError) else type(exc).__name__,
        "message": message,
        "site": site,
        "site_line": site_line,
        "merge_path": mpath,
        "merge_kind": mkind,
        "secondary": False,
        "global_step": global_step,
    }
    if with_traceback:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        ev["traceback"] = text[-TRACEBACK_MAX:]
    return ev


def peer_aborted_event(rank: int, stage: str, why: str, global_step: Optional[int] = None) -> Dict[str, Any]:
    """The event of a rank that was stopped by the runner because another rank had failed (a
    crashed job does not go on); ckptsim's model reports such a rank as PeerAborted too."""
    return {"rank": rank, "at": "error", "stage": stage, "py_type": "PeerAborted", "message": why,
            "site": "", "site_line": None, "merge_path": None, "merge_kind": None, "secondary": True,
            "global_step": global_step}
