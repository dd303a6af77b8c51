"""What the real replay changes in the process, each piece only when asked, and labelled in the
trace (torch; imported only by worker processes):

* TE emulation (--emulate-te, Transformer Engine absent): Megatron's module globals that record
  whether TE is installed are set as they would be with TE:
  distrib_optimizer.HAVE_APEX_OR_TE = True and USING_TE_OPTIMIZER = True. Where Megatron's
  OptimizerConfig cannot even be built without TE (f4502eb1c9 and miles-main call
  is_te_min_version() on a TE version of None and raise TypeError), optimizer_config's
  is_te_min_version answers False, which is what d98e8a64dd does without TE (version 0.0.0).
* Stand-in FusedAdam (--fused-adam-standin): StandinFusedAdam below replaces the optimizer class
  that TE would provide (megatron.core.optimizer.Adam, distrib_optimizer.Adam), and
  megatron.core.optimizer.USING_PYTORCH_OPTIMIZER is set False, so get_megatron_optimizer()
  builds it where it would build TE's FusedAdam: the fused_adam kind and the hybrid
  optimizer's GPU part.
* Coalescing workaround (gloo only): torch's _coalescing_manager crashes (SIGSEGV) with gloo and
  all_gather_into_tensor on CUDA tensors; every Megatron module's `_coalescing_manager` name
  is bound to a context manager that lets the collectives run one by one, synchronously.
* Step recorder (always; observes, changes nothing): torch's functional adam()/adamw() are
  wrapped to read each param's step tensor right after the update, i.e. the bias-correction t
  the update used (foreach and fused torch paths increment every step tensor of a param group
  before they compute the bias corrections).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import struct
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


def f32(x: float) -> float:
    """x rounded to float32 (as a C float parameter would receive it)."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


# ---------------------------------------------------------------------------------------------
# Module patches with restore
# ---------------------------------------------------------------------------------------------
class Patches:
    """Sets module attributes and restores them on exit; records what it did."""

    _MISSING = object()

    def __init__(self) -> None:
        self._saved: List[Tuple[Any, str, Any]] = []
        self.notes: List[str] = []

    def set(self, module: Any, name: str, value: Any) -> None:
        self._saved.append((module, name, getattr(module, name, Patches._MISSING)))
        setattr(module, name, value)

    def restore(self) -> None:
        for module, name, old in reversed(self._saved):
            if old is Patches._MISSING:
                try:
                    delattr(module, name)
                except AttributeError:
                    pass
            else:
                setattr(module, name, old)
        self._saved.clear()

    def __enter__(self) -> "Patches":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def te_installed() -> bool:
    try:
        importlib.import_module("transformer_engine.pytorch.optimizers")
        return True
    except Exception:  # noqa: BLE001 - any failure to import means Megatron takes its no-TE branches
        return False


def apex_installed() -> bool:
    try:
        importlib.import_module("apex.optimizers")
        return True
    except Exception:  # noqa: BLE001
        return False


def apply_te_emulation(p: Patches, standin: bool) -> None:
    dmod = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    omod = importlib.import_module("megatron.core.optimizer")
    cfgmod = importlib.import_module("megatron.core.optimizer.optimizer_config")
    umod = importlib.import_module("megatron.core.utils")
    p.set(dmod, "HAVE_APEX_OR_TE", True)
    p.set(dmod, "USING_TE_OPTIMIZER", True)
    p.notes.append("te emulated: distrib_optimizer.HAVE_APEX_OR_TE = USING_TE_OPTIMIZER = True")
    te_version = None
    try:
        te_version = umod.get_te_version()
    except Exception:  # noqa: BLE001
        te_version = None
    if te_version is None and hasattr(cfgmod, "is_te_min_version"):
        p.set(cfgmod, "is_te_min_version", lambda *a, **k: False)
        p.notes.append("te emulated: optimizer_config.is_te_min_version() answers False "
                       "(this commit raises TypeError on TE version None; d98e8a64dd answers False)")
    if standin:
        p.set(omod, "Adam", StandinFusedAdam)
        p.set(omod, "USING_PYTORCH_OPTIMIZER", False)
        p.set(dmod, "Adam", StandinFusedAdam)
        p.notes.append("fused-adam stand-in: megatron.core.optimizer.Adam = distrib_optimizer.Adam = "
                       "replay.emulation.StandinFusedAdam; USING_PYTORCH_OPTIMIZER = False")


@contextlib.contextmanager
def sequential_coalescing_manager(group: Any = None, device: Any = None, async_ops: bool = False):
    """Stands in for torch.distributed._coalescing_manager under gloo: the collectives issued
    inside run one by one, synchronously. Only the synchronous form is supported (the replay
    sets overlap_grad_reduce and overlap_param_gather off)."""
    if async_ops:
        raise NotImplementedError("replay coalescing workaround: async_ops=True is not supported")
    yield None


def apply_coalescing_workaround(p: Patches) -> List[str]:
    """Rebinds `_coalescing_manager` in every loaded megatron module that imported torch's."""
    import torch.distributed as dist

    original = getattr(dist, "_coalescing_manager", None)
    patched = []
    for name, mod in sorted(sys.modules.items()):
        if mod is None or not (name == "megatron" or name.startswith("megatron.")):
            continue
        if getattr(mod, "_coalescing_manager", None) is original and original is not None:
            p.set(mod, "_coalescing_manager", sequential_coalescing_manager)
            patched.append(name)
    p.notes.append("coalescing workaround (gloo): _coalescing_manager made sequential in %s" % ", ".join(patched))
    return patched


# ---------------------------------------------------------------------------------------------
# Step recorder: the t each torch Adam/AdamW update used, per param (observation only)
# ---------------------------------------------------------------------------------------------
class StepRecorder:
    def __init__(self) -> None:
        self.active: Optional[Dict[int, float]] = None
        self.installed: List[str] = []

    def install(self) -> None:
        for modname, fname in (("torch.optim.adam", "adam"), ("torch.optim.adamw", "adamw")):
            try:
                mod = importlib.import_module(modname)
            except ImportError:
                continue
            orig = getattr(mod, fname, None)
            if orig is None or getattr(orig, "_ckptsim_recorder", False):
                continue
            setattr(mod, fname, self._wrap(orig))
            self.installed.append("%s.%s" % (modname, fname))

    def _wrap(self, orig: Callable) -> Callable:
        recorder = self

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if recorder.active is not None:
                params = args[0] if args else kwargs.get("params")
                steps = args[5] if len(args) > 5 else kwargs.get("state_steps")
                if params is not None and steps is not None:
                    for p, s in zip(params, steps):
                        recorder.active[id(p)] = float(s)
            return out

        wrapper._ckptsim_recorder = True  # type: ignore[attr-defined]
        return wrapper

    def start(self) -> None:
        self.active = {}

    def stop(self) -> Dict[int, float]:
        out, self.active = self.active or {}, None
        return out


STEP_RECORDER = StepRecorder()


# ---------------------------------------------------------------------------------------------
# Stand-in for Transformer Engine's FusedAdam (transformer_engine/pytorch/optimizers/fused_adam.py)
# ---------------------------------------------------------------------------------------------
class StandinFusedAdam(torch.optim.Optimizer):
    """TE FusedAdam's documented semantics, for fp32 params and fp32 states, in plain torch ops.

    What it keeps of TE (and what ckptsim's model of FusedAdam assumes):
      * the step counter lives in the param group, as a Python int: before the update, every
        group with at least one param does `group['step'] += 1` (or sets 1); all params of the
        group use that t; a param without a grad still gets its state created, but is not updated;
      * state is created lazily at the first step, as zeros: {'exp_avg', 'exp_avg_sq'} (fp32);
      * adam_w_mode=True (ADAM_MODE_1, decoupled weight decay) and False (ADAM_MODE_0, L2);
      * load_state_dict() re-creates every state tensor (new fp32 tensors, values copied), as
        TE's set_scaled_state() does, and rejects state names other than exp_avg, exp_avg_sq and
        master_param with KeyError (TE looks them up in name_to_dtype_map);
      * the host-side scalars are those of TE's multi_tensor_adam binding: lr, betas, eps and
        weight decay rounded to float, t a C int, 1 - beta^t computed in double and rounded to
        float.
    What differs: the update is a sequence of torch elementwise ops, each one IEEE float op
    (no FMA contraction, true division, correctly rounded sqrt), in the operation order of
    ckptsim's model (model/adam_math.cpp fused_adam_update); TE's kernel is built with FMA
    contraction and may differ from it by an ulp or so. Not supported (NotImplementedError):
    master weights, capturable mode, low-precision states, store_param_remainders, AMSGrad.
    """

    ckptsim_standin = True

    def __init__(self, params: Any, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 bias_correction: bool = True, adam_w_mode: bool = True, capturable: bool = False,
                 master_weights: bool = False, master_weight_dtype: torch.dtype = torch.float32,
                 exp_avg_dtype: torch.dtype = torch.float32, exp_avg_sq_dtype: torch.dtype = torch.float32,
                 use_decoupled_grad: bool = False, store_param_remainders: bool = False,
                 set_grad_none: Optional[bool] = None) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if capturable or master_weights or exp_avg_dtype != torch.float32 or exp_avg_sq_dtype != torch.float32:
            raise NotImplementedError(
                "replay stand-in FusedAdam: only fp32 states without master weights or capturable mode "
                "(got capturable=%s master_weights=%s exp_avg_dtype=%s exp_avg_sq_dtype=%s)"
                % (capturable, master_weights, exp_avg_dtype, exp_avg_sq_dtype))
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = False
        self.master_weights = False
        self.use_decoupled_grad = use_decoupled_grad
        self.store_param_remainders = False
        self.name_to_dtype_map = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                                  "master_param": master_weight_dtype}
        self.last_step_used: Dict[int, int] = {}

    def initialize_state(self, param: torch.Tensor, store_param_remainders: bool = False) -> None:
        self._initialize_state(param, "exp_avg", zero_buffer=True)
        self._initialize_state(param, "exp_avg_sq", zero_buffer=True)

    def _initialize_state(self, param: torch.Tensor, state_name: str, zero_buffer: bool) -> None:
        dtype = self.name_to_dtype_map[state_name]  # KeyError for other names, as in TE
        data = torch.empty_like(param, dtype=dtype)
        if zero_buffer:
            data.zero_()
        self.state[param][state_name] = data

    def get_unscaled_state(self, param: torch.Tensor, state_name: str) -> torch.Tensor:
        return self.state[param][state_name]

    def set_scaled_state(self, param: torch.Tensor, state_name: str, unscaled_state: torch.Tensor) -> None:
        assert unscaled_state.dtype == torch.float32
        state = self.state[param]
        if state_name not in state:
            self._initialize_state(param, state_name, False)
        state[state_name].copy_(unscaled_state)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved_params = [p for g in state_dict["param_groups"] for p in g["params"]]
        current = [p for g in self.param_groups for p in g["params"]]
        id_map = dict(zip(saved_params, current))
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                self.state[param] = {}
                for name in v:
                    if v[name] is None:
                        continue
                    self.set_scaled_state(param, name, v[name].float())

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None, grad_scaler: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if len(group["params"]) == 0:
                continue
            if "step" in group:
                group["step"] += 1
            else:
                group["step"] = 1
            t = group["step"]
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    self.initialize_state(p)
                if self.use_decoupled_grad:
                    g = getattr(p, "decoupled_grad", None)
                else:
                    g = p.grad
                if g is None:
                    continue
                if p.dtype != torch.float32 or g.dtype != torch.float32:
                    raise NotImplementedError("replay stand-in FusedAdam: fp32 params and grads only, got %s/%s"
                                              % (p.dtype, g.dtype))
                te_adam_update(p.data, g, state["exp_avg"], state["exp_avg_sq"], lr=group["lr"],
                               betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"],
                               step=t, adam_w_mode=self.adam_w_mode, bias_correction=bool(group["bias_correction"]))
                self.last_step_used[id(p)] = t
        return loss


def te_scalars(lr: float, betas: Tuple[float, float], eps: float, weight_decay: float, step: int,
               bias_correction: bool) -> Dict[str, float]:
    """The host-side scalars of TE's multi_tensor_adam (each a float32 value held in a Python float)."""
    if not (1 <= int(step) <= 2 ** 31 - 1):
        raise ValueError("FusedAdam step %r does not fit a C int" % (step,))
    b1, b2 = f32(betas[0]), f32(betas[1])
    if bias_correction:
        bc1 = f32(1.0 - math.pow(b1, float(int(step))))
        bc2 = f32(1.0 - math.pow(b2, float(int(step))))
    else:
        bc1 = bc2 = 1.0
    return {"lr": f32(lr), "beta1": b1, "beta2": b2, "eps": f32(eps), "weight_decay": f32(weight_decay),
            "bc1": bc1, "bc2": bc2, "omb1": f32(1.0 - b1), "omb2": f32(1.0 - b2)}


def te_adam_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, lr: float,
                   betas: Tuple[float, float], eps: float, weight_decay: float, step: int, adam_w_mode: int,
                   bias_correction: bool) -> None:
    """One TE-semantics Adam update of fp32 tensors in place (see StandinFusedAdam)."""
    s = te_scalars(lr, betas, eps, weight_decay, step, bias_correction)
    # A division by a Python scalar would run as a multiplication by its reciprocal on CUDA, so
    # the bias corrections are 0-dim tensors on the param's device: a true IEEE division.
    bc1 = torch.tensor(s["bc1"], dtype=torch.float32, device=p.device)
    bc2 = torch.tensor(s["bc2"], dtype=torch.float32, device=p.device)
    if adam_w_mode == 0:
        g = torch.add(g, torch.mul(p, s["weight_decay"]))
    m.mul_(s["beta1"]).add_(torch.mul(g, s["omb1"]))
    v.mul_(s["beta2"]).add_(torch.mul(torch.mul(g, s["omb2"]), g))
    denom = torch.add(torch.sqrt(torch.div(v, bc2)), s["eps"])
    update = torch.div(torch.div(m, bc1), denom)
    if adam_w_mode == 1:
        update = torch.add(update, torch.mul(p, s["weight_decay"]))
    p.sub_(torch.mul(update, s["lr"]))
