"""Where a param sits in a TP x PP x DP world (torch-free; the runner and the plan checks).

A scenario's param has a global `shape` ([numel] by default), a `tp_split` ("replicated",
"column": dim 0 split over the TP ranks, as ColumnParallelLinear's weight; "row": dim 1, as
RowParallelLinear's) and a `layer` (pipeline stage s of pp holds layers [s*L/pp, (s+1)*L/pp),
L = the highest layer + 1). The world's ranks are numbered as parallel_state's default order
tp-cp-ep-dp-pp numbers them: rank = tp_rank + tp * (dp_rank + dp * pp_rank).

Expert parallelism (issue 26, MoE chained optimizers): a param with `expert` true is one that a
MoE layer marks `allreduce = False` (GroupedMLP, TE's grouped linear at EP > 1): DDP puts it in
its expert buffers on the expert-data-parallel group, and get_megatron_optimizer() builds a
second DistributedOptimizer for it. A scenario's phases name `ep` (expert_model_parallel_size,
the same in every phase); parallel_state numbers the expert ranks in the same order with the
expert TP size = tp and no CP: rank = tp_rank + tp * (ep_rank + ep * (expert_dp_rank + (dp / ep) *
pp_rank)). Expert params are modeled only at TP = PP = 1, where EP rank e = rank % ep, the
expert-DP rank = rank // ep, and the expert-DP group of EP rank e is {e, e + ep, e + 2 ep, ...}.
An expert param of global shape [rows] or [rows, cols] is split over EP on dim 0: EP rank e holds
rows [e rows / ep, (e + 1) rows / ep), one contiguous run of its flattened elements (a "column"
split with tp = ep and tp_rank = e). These EP rules come from the issue-26 brief; ckptsim's scenario
parser had no `ep` or `expert` yet when they were written (2026-12), so its messages are to follow
these, not the other way round.

The same rules as ckptsim's model/config.cpp (global_shape, num_layers, pipeline_stage,
tp_element_runs) and sim/scenario.cpp (model_parallel_problem); tests/replay/test_model_parallel.py
holds them to worked examples.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

TP_SPLITS = ("replicated", "column", "row")
Runs = List[Tuple[int, int]]  # (global begin, length) in the flattened whole param


def is_expert(p: Dict[str, Any]) -> bool:
    """An expert param (`"expert": true`; Megatron's `param.allreduce = False`)."""
    return p.get("expert", False) is True


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


def expert_place(rank: int, tp: int, dp: int, ep: int) -> Tuple[int, int]:
    """(ep_rank, expert_dp_rank) of world rank `rank` in a world of TP tp and DP dp (parallel_state's
    expert rank generator, order tp-cp-ep-dp-pp, expert TP = tp, no CP). REQUIRES: ep divides dp."""
    return (rank // tp) % ep, (rank // (tp * ep)) % (dp // ep)


def expert_dp_group(ep_rank: int, ep: int, dp: int) -> List[int]:
    """The world ranks of the expert-DP group of EP rank `ep_rank` at TP = PP = 1 (the group that
    reduces and shards the expert params' gradients and optimizer state): {e, e + ep, ...}."""
    return list(range(ep_rank, dp, ep))


def local_shape(p: Dict[str, Any], tp: int, ep: int = 1) -> List[int]:
    """The shape of the piece a rank holds: an expert param's EP piece (dim 0 divided by ep), else
    its TP piece."""
    shape = global_shape(p)
    if is_expert(p):
        shape[0] //= ep
        return shape
    axis = tp_axis(p)
    if axis >= 0:
        shape[axis] //= tp
    return shape


def element_runs(p: Dict[str, Any], tp: int, tp_rank: int, ep: int = 1, ep_rank: int = 0) -> Runs:
    """The runs of the whole param's flattened elements that the rank of TP rank `tp_rank` and EP
    rank `ep_rank` holds, in the order its piece holds them (row-major in its local shape): one
    run, except a row split's at TP > 1: one per row. An expert param's piece is its EP piece
    (rows [ep_rank rows / ep, (ep_rank + 1) rows / ep): one run); it is never TP-split (expert
    params are modeled only at TP = PP = 1)."""
    shape = global_shape(p)
    if is_expert(p):
        piece = int(p["numel"]) // ep
        return [(ep_rank * piece, piece)]
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
    if "expert" in p and not isinstance(p["expert"], bool):
        return path + ".expert", "must be true or false, got %r" % (p["expert"],)
    return None


def phase_problem(params: Sequence[Dict[str, Any]], ph: Dict[str, Any], path: str) -> Optional[Tuple[str, str]]:
    """(field, problem) of one phase's tp / pp against the (valid) params, or None."""
    for k in ("tp", "pp"):
        v = ph.get(k, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return "%s.%s" % (path, k), "must be an integer >= 1, got %r" % (v,)
    tp, pp = int(ph.get("tp", 1)), int(ph.get("pp", 1))
    problem = _ep_problem(params, ph, path, tp, pp)
    if problem:
        return problem
    for i, p in enumerate(params):
        if is_expert(p):
            continue  # split over EP, never over TP (expert params need TP = 1)
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


def phase_ep(ph: Dict[str, Any]) -> int:
    """A (valid) phase's expert_model_parallel_size (`ep`, default 1)."""
    return int(ph.get("ep", 1))


def scenario_ep(sc: Dict[str, Any]) -> int:
    """The EP size of a (valid) scenario: every phase has the same (scenario_problem)."""
    return phase_ep(sc["phases"][0])


def _ep_problem(params: Sequence[Dict[str, Any]], ph: Dict[str, Any], path: str, tp: int,
                pp: int) -> Optional[Tuple[str, str]]:
    """(field, problem) of one phase's ep against its DP size and the (valid) params, or None."""
    ep = ph.get("ep", 1)
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        return path + ".ep", "must be an integer >= 1, got %r" % (ep,)
    dp = ph.get("dp")
    if isinstance(dp, int) and not isinstance(dp, bool) and dp >= 1 and dp % ep:
        return path + ".ep", "%d does not divide the phase's DP size %d (expert DP = DP / EP)" % (ep, dp)
    experts = [(i, p) for i, p in enumerate(params) if is_expert(p)]
    if experts and (tp, pp) != (1, 1):
        i, p = experts[0]
        return (path + (".tp" if tp != 1 else ".pp"),
                "expert params with TP or PP are not modeled yet (params[%d] %r is expert; tp %d, pp %d)"
                % (i, p["name"], tp, pp))
    for i, p in experts:
        rows = global_shape(p)[0]
        if rows % ep:
            return path + ".ep", "%d does not divide dim 0 (%d) of params[%d] (%r, expert: split over EP on dim 0)" % (
                ep, rows, i, p["name"])
    return None


def scenario_problem(params: Sequence[Dict[str, Any]], phases: Sequence[Any], path: str
                     ) -> Optional[Tuple[str, str]]:
    """(field, problem) of what concerns the whole scenario's expert parallelism, or None: the
    same ep in every phase, and a dense part (at least one param not expert)."""
    first = None
    for j, ph in enumerate(phases):
        if not isinstance(ph, dict):
            continue
        ep = ph.get("ep", 1)
        if first is None:
            first = (j, ep)
        elif ep != first[1]:
            return ("%s.phases[%d].ep" % (path, j),
                    "%r where phases[%d] has %r: an EP change between phases is not modeled"
                    % (ep, first[0], first[1]))
    if params and all(is_expert(p) for p in params):
        return (path + ".params", "every param is expert: a model without a dense param (a stub dense part of "
                                  "the chained optimizer) is not modeled yet")
    return None
