"""Where a param sits in a TP x PP x DP world (torch-free; the runner and the plan checks).

A scenario's param has a global `shape` ([numel] by default), a `tp_split` ("replicated",
"column": dim 0 split over the TP ranks, as ColumnParallelLinear's weight; "row": dim 1, as
RowParallelLinear's) and a `layer` (pipeline stage s of pp holds layers [s*L/pp, (s+1)*L/pp),
L = the highest layer + 1). The world's ranks are numbered as parallel_state's default order
tp-cp-ep-dp-pp numbers them: rank = tp_rank + tp * (dp_rank + dp * pp_rank).

The same rules as ckptsim's model/config.cpp (global_shape, num_layers, pipeline_stage,
tp_element_runs) and sim/scenario.cpp (model_parallel_problem); tests/replay/test_model_parallel.py
holds them to worked examples.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

TP_SPLITS = ("replicated", "column", "row")
Runs = List[Tuple[int, int]]  # (global begin, length) in the flattened whole param


def global_shape(p: Dict[str, Any]) -> List[int]:
    return [int(d) for d in p["shape"]] if p.get("shape") else [int(p["numel"])]


def tp_axis(p: Dict[str, Any]) -> int:
    """The dim TP splits (-1: replicated)."""
    return {"column": 0, "row": 1}.get(p.get("tp_split", "replicated"), -1)


def num_layers(params: Sequence[Dict[str, Any]]) -> int:
    return max([1] + [int(p.get("layer", 0)) + 1 for p in params])


def pipeline_stage(p: Dict[str, Any], layers: int, pp: int) -> int:
    return int(p.get("layer", 0)) // (layers // pp)


def place(rank: int, tp: int, dp: int) -> Tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of world rank `rank`."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def local_shape(p: Dict[str, Any], tp: int) -> List[int]:
    shape = global_shape(p)
    axis = tp_axis(p)
    if axis >= 0:
        shape[axis] //= tp
    return shape


def element_runs(p: Dict[str, Any], tp: int, tp_rank: int) -> Runs:
    """The runs of the whole param's flattened elements that TP rank `tp_rank` holds, in the
    order its piece holds them (row-major in its local shape): one run, except a row split's at
    TP > 1: one per row."""
    shape = global_shape(p)
    if p.get("tp_split") == "row" and tp > 1:
        cols = shape[1] // tp
        return [(r * shape[1] + tp_rank * cols, cols) for r in range(shape[0])]
    if p.get("tp_split") == "column":
        piece = int(p["numel"]) // tp
        return [(tp_rank * piece, piece)]
    return [(0, int(p["numel"]))]


def global_ranges(runs: Runs, begin: int, end: int) -> List[Tuple[int, int]]:
    """[begin, end) of the piece's flattened elements, as [start, end) ranges of the whole param
    (one per run it touches, in order)."""
    out, at = [], 0
    for g, n in runs:
        lo, hi = max(begin, at), min(end, at + n)
        if lo < hi:
            out.append((g + lo - at, g + hi - at))
        at += n
    return out


def stage_params(params: Sequence[Dict[str, Any]], pp: int, pp_rank: int) -> List[int]:
    """Indices (model order) of the params stage `pp_rank` of `pp` holds."""
    layers = num_layers(params)
    return [i for i, p in enumerate(params) if pipeline_stage(p, layers, pp) == pp_rank]


def run_sizes(run: Dict[str, Any]) -> Tuple[int, int, int]:
    """(tp, pp, dp) of a plan's or a trace's run (tp and pp default to 1)."""
    return int(run.get("tp", 1)), int(run.get("pp", 1)), int(run["dp"])


def world_size(run: Dict[str, Any]) -> int:
    tp, pp, dp = run_sizes(run)
    return tp * pp * dp


def param_problem(p: Dict[str, Any], path: str) -> Optional[Tuple[str, str]]:
    """(field, problem) of one param's shape / tp_split / layer, or None."""
    shape = p.get("shape")
    if shape is not None:
        if (not isinstance(shape, list) or not 1 <= len(shape) <= 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)):
            return path + ".shape", "must be [rows] or [rows, cols] of integers >= 1, got %r" % (shape,)
        product = 1
        for d in shape:
            product *= d
        if product != p.get("numel"):
            return path + ".shape", "holds %d elements, numel is %r" % (product, p.get("numel"))
    split = p.get("tp_split", "replicated")
    if split not in TP_SPLITS:
        return path + ".tp_split", "must be one of %s, got %r" % (", ".join(TP_SPLITS), split)
    if split == "row" and len(shape or [0]) != 2:
        return path + ".tp_split", "row splits dim 1: the param needs a 2-D shape"
    layer = p.get("layer", 0)
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        return path + ".layer", "must be an integer >= 0, got %r" % (layer,)
    return None


def phase_problem(params: Sequence[Dict[str, Any]], ph: Dict[str, Any], path: str) -> Optional[Tuple[str, str]]:
    """(field, problem) of one phase's tp / pp against the (valid) params, or None."""
    for k in ("tp", "pp"):
        v = ph.get(k, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return "%s.%s" % (path, k), "must be an integer >= 1, got %r" % (v,)
    tp, pp = int(ph.get("tp", 1)), int(ph.get("pp", 1))
    for i, p in enumerate(params):
        axis = tp_axis(p)
        if axis >= 0 and global_shape(p)[axis] % tp:
            return path + ".tp", "%d does not divide dim %d (%d) of params[%d] (%r, %s-parallel)" % (
                tp, axis, global_shape(p)[axis], i, p["name"], p["tp_split"])
    layers = num_layers(params)
    if layers % pp:
        return path + ".pp", "%d stages cannot split the %d layers the params name (params[].layer)" % (pp, layers)
    for stage in range(pp):
        if not stage_params(params, pp, stage):
            return path + ".pp", "stage %d (layers %d to %d) holds no param" % (
                stage, stage * layers // pp, (stage + 1) * layers // pp - 1)
    return None
