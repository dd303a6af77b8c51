"""What the real replay changes in the process, each piece only when asked, and labelled in the
trace (torch; imported only by worker processes):

* TE emulation (--emulate-te, Transformer Engine absent): Megatron's module globals that record
  whether TE is installed are set as they would be with TE:
  distrib_optimizer.HAVE_APEX_OR_TE = True and USING_TE_OPTIMIZER = True. Where Megatron's
  OptimizerConfig cannot even be built without TE (f4502eb1c9 and miles-main call
  is_te_min_version() on a TE version of None and raise TypeError), optimizer_config's
  is_te_min_version answers False, which is what d98e8a64dd does without TE (version 0.0.0).
  A precision-aware FusedAdam scenario (with the stand-in) gets an emulated TE of version
  te_emulation.EMULATED_TE_VERSION instead: is_te_min_version() answers as that TE would in
  optimizer_config and megatron.core.optimizer, and transformer_engine.pytorch.optimizers (its
  FusedAdam the stand-in) is importable while OptimizerConfig is built, and only then.
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
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import te_emulation


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


def apply_te_emulation(p: Patches, standin: bool, te_version: Optional[str] = None) -> None:
    """`te_version`: where given (a precision-aware FusedAdam scenario on the stand-in:
    te_emulation.EMULATED_TE_VERSION), is_te_min_version() answers as a TE of that version in
    both namespaces that ask it on the optimizer's path (optimizer_config and
    megatron.core.optimizer), so that store_param_remainders reaches the FusedAdam as the scenario
    says. Else optimizer_config's answers False where this commit would raise on a TE version of
    None, as today."""
    dmod = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    omod = importlib.import_module("megatron.core.optimizer")
    cfgmod = importlib.import_module("megatron.core.optimizer.optimizer_config")
    umod = importlib.import_module("megatron.core.utils")
    p.set(dmod, "HAVE_APEX_OR_TE", True)
    p.set(dmod, "USING_TE_OPTIMIZER", True)
    p.notes.append("te emulated: distrib_optimizer.HAVE_APEX_OR_TE = USING_TE_OPTIMIZER = True")
    if te_version is not None:
        answer = te_emulation.is_te_min_version_of(te_version)
        patched = []
        for mod in (cfgmod, omod):
            if hasattr(mod, "is_te_min_version"):
                p.set(mod, "is_te_min_version", answer)
                patched.append(mod.__name__)
        p.notes.append("te emulated: is_te_min_version() of %s answers as TE %s would (True iff the version "
                       "asked is <= %s), so that the precision-aware FusedAdam gets store_param_remainders as "
                       "the scenario says" % (" and ".join(patched), te_version, te_version))
    else:
        installed = None
        try:
            installed = umod.get_te_version()
        except Exception:  # noqa: BLE001
            installed = None
        if installed is None and hasattr(cfgmod, "is_te_min_version"):
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
def fake_te_optimizers_module(notes: List[str]) -> Iterator[Any]:
    """transformer_engine.pytorch.optimizers, with StandinFusedAdam as its FusedAdam, importable
    inside the block only (te_emulation.sys_modules_entry: not its parent packages, so nothing
    else believes TE is installed). For OptimizerConfig(use_precision_aware_optimizer=True)
    without CPU offload, whose __post_init__ imports that FusedAdam and checks its signature
    (RuntimeError where the import fails). Adds the trace note to `notes`."""
    attrs = {"FusedAdam": StandinFusedAdam}
    mod = te_emulation.fake_module(te_emulation.TE_OPTIMIZERS_MODULE, **attrs)
    note = te_emulation.describe_fake(te_emulation.TE_OPTIMIZERS_MODULE,
                                      {"FusedAdam": "replay.emulation.StandinFusedAdam"})
    if note not in notes:
        notes.append(note)
    with te_emulation.sys_modules_entry(te_emulation.TE_OPTIMIZERS_MODULE, mod):
        yield mod


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
    """TE FusedAdam's semantics (transformer_engine/pytorch/optimizers/fused_adam.py and the
    kernels of transformer_engine/common/multi_tensor/adam.cu) in plain torch ops, including the
    precision-aware options Megatron passes with --use-precision-aware-optimizer.

    What it keeps of TE (and what ckptsim's model of FusedAdam assumes):
      * the step counter lives in the param group, as a Python int: before the update, every
        group with at least one param does `group['step'] += 1` (or sets 1); all params of the
        group use that t; a param without a grad still gets its state created, but is not
        updated. An empty group's step is not advanced: TE's behaviour before TE PR #3318 (TE
        HEAD advances it), kept deliberately;
      * state is created lazily at the first step (initialize_state(param,
        store_param_remainders)): exp_avg and exp_avg_sq as zeros in exp_avg_dtype /
        exp_avg_sq_dtype (fp32, bf16 or fp16); with master_weights also master_param: an fp32
        clone of the param, or, for a bf16 param under store_param_remainders, int16 zeros (the
        low 16 bits of the fp32 master; the bf16 param holds the high ones). store_param_remainders
        takes effect only with master_weights and an fp32 master_weight_dtype, and only for bf16
        params. Every non-fp32 state (bf16 too) gets a scale, an fp32 [1] tensor of ones, in
        `_scales[param][name]`;
      * the update of a param: its moments unscaled to fp32 (bf16: .float(); fp16: .float() times
        the scale), the master it updates in fp32 (the fp32 master_param; for a bf16 param with
        remainders the fp32 whose high half is the param's bits, less 1 where the remainder is
        negative, and whose low half is the remainder: adam.cu AdamFunctorMasterParamRemainder's
        "undo rounding"; an fp32 param is its own master, and the master_param TE created for it
        at init is never updated, as in TE, where fp32 params go to the kernel without master);
        then the Adam update; then the master written back (fp32 master_param; a bf16 param
        gets the master rounded to nearest even, as the kernel's static_cast; with remainders
        the remainder is the master's low half and the bf16 bits its high half plus 1 where the
        remainder is negative: "round up", i.e. ties away from zero) and the moments stored as
        _apply_scale stores them (bf16: rounded to nearest even; fp16: a new scale =
        amax / (finfo(fp16).max / 2), the fp32 values multiplied in place by its reciprocal (0
        where the scale is 0), then rounded to fp16);
      * get_unscaled_state() / set_scaled_state() / _apply_scale() with TE's dtype asserts: a
        set takes fp32, or int16 for a bf16 param's master_param under remainders; a get gives
        fp32 (the state itself where it is fp32), the int16 remainders as they are;
      * state_dict() holds every state through get_unscaled_state() (fp32, int16 remainders);
        load_state_dict() runs torch's loader (which casts state to the param dtype), then sets
        every state again from the original, uncast dict: int16 remainders verbatim, all else
        through .float() and set_scaled_state(), so new state tensors and, for fp16, new scales;
        a state name other than exp_avg, exp_avg_sq and master_param is a KeyError (TE looks it up
        in name_to_dtype_map);
      * adam_w_mode=True (ADAM_MODE_1, decoupled weight decay) and False (ADAM_MODE_0, L2);
        use_decoupled_grad (the grad read from `param.decoupled_grad`);
      * the host-side scalars are those of TE's multi_tensor_adam binding: lr, betas, eps and
        weight decay rounded to float, t a C int, 1 - beta^t computed in double and rounded to
        float.
    What differs: the update is a sequence of torch elementwise ops, each one IEEE float op
    (no FMA contraction, true division, correctly rounded sqrt), in the operation order of
    ckptsim's model (model/adam_math.cpp fused_adam_update); TE's kernel is built with FMA
    contraction and may differ from it by an ulp or so. TE (v2.14 on) reads and writes bf16
    moments inside the kernel when both are bf16 ("fuse_unscale"); the stand-in widens and
    rounds them around the update instead, which gives the same values. No DTensor or
    QuantizedTensor params. Not supported (NotImplementedError): capturable mode, fp16 master
    weights, FP8 (uint8) states, fp16 params, bf16 params without master weights, grads other than
    fp32. AMSGrad and dtypes TE rejects raise TE's RuntimeError.
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
        # TE's own constraints first (fused_adam.py __init__), then what the stand-in leaves out.
        if master_weights and master_weight_dtype not in (torch.float32, torch.float16):
            raise RuntimeError("FusedAdam only supports fp32/fp16 master weights.")
        if exp_avg_dtype not in _TE_MOMENT_DTYPES:
            raise RuntimeError("FusedAdam only supports fp32/fp16/bf16/fp8 exp_avg.")
        if exp_avg_sq_dtype not in _TE_MOMENT_DTYPES:
            raise RuntimeError("FusedAdam only supports fp32/fp16/bf16/fp8 exp_avg_sq.")
        unsupported = []
        if capturable:
            unsupported.append("capturable=True")
        if master_weights and master_weight_dtype != torch.float32:
            unsupported.append("master_weight_dtype=%s" % master_weight_dtype)
        for name, dtype in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if dtype == torch.uint8:
                unsupported.append("%s=torch.uint8 (FP8 states need TE's Float8Tensor)" % name)
        if unsupported:
            raise NotImplementedError("replay stand-in FusedAdam: not supported: %s" % ", ".join(unsupported))
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = False
        self.master_weights = bool(master_weights)
        self.master_weight_dtype = master_weight_dtype
        self.exp_avg_dtype = exp_avg_dtype
        self.exp_avg_sq_dtype = exp_avg_sq_dtype
        self.name_to_dtype_map = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                                  "master_param": master_weight_dtype}
        self.dtype_to_range_map = {
            torch.float16: torch.full([1], torch.finfo(torch.float16).max / 2.0, dtype=torch.float32)}
        self._scales: Dict[Any, Dict[str, torch.Tensor]] = {}
        self.use_decoupled_grad = use_decoupled_grad
        # As TE: remainders only with fp32 master weights (and, per param, only for bf16 params).
        self.store_param_remainders = bool(store_param_remainders and master_weights
                                           and master_weight_dtype == torch.float32)
        self.set_grad_none = set_grad_none
        self.last_step_used: Dict[int, int] = {}

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """TE's: set_to_none by default; with use_decoupled_grad it is `decoupled_grad` that is
        cleared (set to None, or zeroed)."""
        if self.set_grad_none is not None:
            if set_to_none is not None and set_to_none != self.set_grad_none:
                raise ValueError(f"Called zero_grad with set_to_none={set_to_none}, "
                                 f"but FusedAdam was initialized with set_grad_none={self.set_grad_none}")
            set_to_none = self.set_grad_none
        if set_to_none is None:
            set_to_none = True
        if not self.use_decoupled_grad and not set_to_none:
            super().zero_grad(set_to_none=set_to_none)
            return
        for group in self.param_groups:
            for p in group["params"]:
                if self.use_decoupled_grad and set_to_none:
                    p.decoupled_grad = None
                elif self.use_decoupled_grad and not set_to_none:
                    p.decoupled_grad.zero_()
                elif not self.use_decoupled_grad and set_to_none:
                    p.grad = None

    # ---------------------------------------------------------------- state (TE's names)
    def _remainders(self, param: torch.Tensor, state_name: str) -> bool:
        """Whether `state_name` of `param` is the int16 remainder of a bf16 param's fp32 master."""
        return self.store_param_remainders and state_name == "master_param" and param.dtype == torch.bfloat16

    def initialize_state(self, param: torch.Tensor, store_param_remainders: bool) -> None:
        self._initialize_state(param, "exp_avg", zero_buffer=True)
        self._initialize_state(param, "exp_avg_sq", zero_buffer=True)
        if self.master_weights:
            self._initialize_state(param, "master_param", zero_buffer=False,
                                   store_param_remainders=store_param_remainders)
            if not store_param_remainders:
                self.set_scaled_state(param, "master_param", param.clone().detach().float())

    def _initialize_state(self, param: torch.Tensor, state_name: str, zero_buffer: bool,
                          store_param_remainders: bool = False) -> None:
        dtype = self.name_to_dtype_map[state_name]  # KeyError for other names, as in TE
        if store_param_remainders:
            data = torch.zeros_like(param, dtype=torch.int16)
        else:
            data = torch.empty_like(param, dtype=dtype)
        if zero_buffer:
            data.zero_()
        self.state[param][state_name] = data
        if dtype != torch.float32:
            self._scales.setdefault(param, {})[state_name] = torch.ones([1], dtype=torch.float32, device=param.device)

    def _apply_scale(self, state_name: str, unscaled_state: torch.Tensor, scaled_state: torch.Tensor,
                     scale: torch.Tensor) -> None:
        """Stores fp32 `unscaled_state` into the low-precision `scaled_state`; `scale` (and, for
        fp16, `unscaled_state` itself) are written in place, as in TE."""
        assert unscaled_state.dtype == torch.float32
        if scaled_state.dtype == torch.bfloat16:
            scaled_state.copy_(unscaled_state.bfloat16())
            return
        dtype = self.name_to_dtype_map[state_name]
        assert scaled_state.dtype == dtype
        max_range = self.dtype_to_range_map[dtype]
        if max_range.device != scaled_state.device:
            max_range = max_range.to(scaled_state.device)
            self.dtype_to_range_map[scaled_state.dtype] = max_range
        if unscaled_state.device != scaled_state.device:
            unscaled_state = unscaled_state.to(scaled_state.device)
        min_val, max_val = torch.aminmax(unscaled_state)
        absmax = torch.maximum(-min_val, max_val)
        absmax = absmax.to(dtype=torch.float32, device=unscaled_state.device)
        torch.div(absmax, max_range, out=scale)
        rscale = torch.where(scale > 0, scale.reciprocal(), 0.0)
        unscaled_state.mul_(rscale)
        scaled_state.copy_(unscaled_state)

    def get_unscaled_state(self, param: torch.Tensor, state_name: str, skip_unscale: bool = False) -> torch.Tensor:
        state = self.state[param]
        dtype = self.name_to_dtype_map[state_name]
        stored = state[state_name]
        if dtype == torch.float16:
            assert stored.dtype == torch.float16
            unscaled = stored.float()
            unscaled.mul_(self._scales[param][state_name])
        elif dtype == torch.float32:
            if self._remainders(param, state_name):
                assert stored.dtype == torch.int16
            else:
                assert stored.dtype == torch.float32
            unscaled = stored
        elif dtype == torch.bfloat16:
            assert stored.dtype == torch.bfloat16
            unscaled = stored if skip_unscale else stored.float()
        else:
            raise RuntimeError(f"Dtype of {state_name} can only be fp8/fp16/bf16/fp32.")
        return unscaled

    def set_scaled_state(self, param: torch.Tensor, state_name: str, unscaled_state: torch.Tensor) -> None:
        remainders = self._remainders(param, state_name)
        if remainders:
            assert unscaled_state.dtype == torch.int16
        else:
            assert unscaled_state.dtype == torch.float32
        state = self.state[param]
        if state_name not in state:
            self._initialize_state(param, state_name, False, remainders)
        stored = state[state_name]
        if self.name_to_dtype_map[state_name] != torch.float32:
            self._apply_scale(state_name, unscaled_state, stored, self._scales[param][state_name])
        else:
            stored.copy_(unscaled_state)

    def state_dict(self) -> Dict[str, Any]:
        state_dict = super().state_dict()
        saved = [p for g in state_dict["param_groups"] for p in g["params"]]
        current = [p for g in self.param_groups for p in g["params"]]
        id_map = dict(zip(saved, current))
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state_dict["state"][k] = {name: self.get_unscaled_state(param, name) for name in v}
        return state_dict

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
                    value = v[name]
                    if self._remainders(param, name):
                        self.set_scaled_state(param, name, value)
                        assert value.dtype == torch.int16
                    else:
                        self.set_scaled_state(param, name, value.float())

    # ---------------------------------------------------------------- the step
    def _unscaled_moment(self, param: torch.Tensor, name: str) -> torch.Tensor:
        """The fp32 moment the update works on: the state itself where it is fp32."""
        return self.get_unscaled_state(param, name)

    def _store_moment(self, param: torch.Tensor, name: str, unscaled: torch.Tensor) -> None:
        if self.name_to_dtype_map[name] != torch.float32:
            self._apply_scale(name, unscaled, self.state[param][name], self._scales[param][name])

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
                remainders = self.store_param_remainders and p.dtype == torch.bfloat16
                if len(state) == 0:
                    self.initialize_state(p, remainders)
                if self.use_decoupled_grad:
                    g = getattr(p, "decoupled_grad", None)
                else:
                    g = p.grad
                if g is None:
                    continue
                if g.dtype != torch.float32:
                    raise NotImplementedError("replay stand-in FusedAdam: fp32 grads only, got %s" % g.dtype)
                if p.dtype == torch.float32:
                    master = p.data  # TE: no master for fp32 params, whatever master_weights says
                elif p.dtype == torch.bfloat16 and self.master_weights:
                    if remainders:
                        master = master_from_remainder(p.data, state["master_param"])
                    else:
                        master = self.get_unscaled_state(p, "master_param")  # the fp32 state itself
                else:
                    raise NotImplementedError("replay stand-in FusedAdam: fp32 params, or bf16 params with "
                                              "master_weights, only; got %s (master_weights=%s)"
                                              % (p.dtype, self.master_weights))
                m = self._unscaled_moment(p, "exp_avg")
                v = self._unscaled_moment(p, "exp_avg_sq")
                te_adam_update(master, g, m, v, lr=group["lr"], betas=group["betas"], eps=group["eps"],
                               weight_decay=group["weight_decay"], step=t, adam_w_mode=self.adam_w_mode,
                               bias_correction=bool(group["bias_correction"]))
                if p.dtype == torch.bfloat16:
                    if remainders:
                        bits, remainder = split_master(master)
                        p.data.view(torch.int16).copy_(bits.view(p.shape))
                        state["master_param"].copy_(remainder.view(p.shape))
                    else:
                        p.data.copy_(master.to(torch.bfloat16))
                self._store_moment(p, "exp_avg", m)
                self._store_moment(p, "exp_avg_sq", v)
                self.last_step_used[id(p)] = t
        return loss


_TE_MOMENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)


def _require_little_endian() -> None:
    # The int16 halves of an fp32 are its low half first in memory only on a little-endian host
    # (as in adam.cu's union, on the GPU).
    if sys.byteorder != "little":
        raise NotImplementedError("replay stand-in FusedAdam: param remainders need a little-endian host")


def master_from_remainder(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The fp32 master that a bf16 param and its int16 remainder stand for (adam.cu
    AdamFunctorMasterParamRemainder, "undo rounding"): high half the param's bits, less 1 where
    the remainder is negative (int16 arithmetic, wrapping as the kernel's does), low half the
    remainder. A new fp32 tensor of the param's shape."""
    assert param.dtype == torch.bfloat16 and remainder.dtype == torch.int16, (param.dtype, remainder.dtype)
    assert param.shape == remainder.shape, (param.shape, remainder.shape)
    _require_little_endian()
    low = remainder.detach().reshape(-1)
    high = param.detach().reshape(-1).view(torch.int16) - (low < 0).to(torch.int16)
    halves = torch.stack((low, high), dim=1).contiguous()  # [n, 2]: the low half first in memory
    return halves.view(torch.int32).view(torch.float32).reshape(param.shape)


def split_master(master: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bf16 bits as int16, int16 remainder) of an fp32 master (adam.cu, "round up"): the
    remainder is the low half, the bits the high half plus 1 where the remainder is negative.
    Both flat, contiguous."""
    assert master.dtype == torch.float32, master.dtype
    _require_little_endian()
    halves = master.detach().reshape(-1).contiguous().view(torch.int32).view(torch.int16).view(-1, 2)
    remainder = halves[:, 0].contiguous()
    bits = halves[:, 1] + (remainder < 0).to(torch.int16)
    return bits.contiguous(), remainder


def precision_aware_state(opt: Any, param: torch.Tensor) -> Dict[str, Any]:
    """What the trace records of a precision-aware FusedAdam's param (TE's or the stand-in's):
    {"master": the fp32 values its next update starts from, "exp_avg", "exp_avg_sq": the fp32
    unscaled moments (None where the state does not exist), "state_dtypes": the dtype name of
    every state tensor it holds (te_emulation.dtype_name)}. The master: an fp32 param itself;
    else the fp32 the bf16 param and its int16 remainder stand for; else the fp32 master_param;
    else (no master_param yet: before the first step) the param's own values, which TE's
    initialize_state() copies into it (or, with remainders, a zero remainder stands for)."""
    from .te_emulation import dtype_name

    state = opt.state.get(param, {})
    dtypes = {k: dtype_name(state[k].dtype) for k in ("exp_avg", "exp_avg_sq", "master_param")
              if isinstance(state.get(k), torch.Tensor)}
    stored = state.get("master_param")
    if param.dtype == torch.float32 or not isinstance(stored, torch.Tensor):
        master = param
    elif stored.dtype == torch.int16:
        master = master_from_remainder(param, stored)
    else:
        master = opt.get_unscaled_state(param, "master_param").float()
    out: Dict[str, Any] = {"master": master, "state_dtypes": dtypes}
    for k in ("exp_avg", "exp_avg_sq"):
        out[k] = opt.get_unscaled_state(param, k).float() if k in dtypes else None
    return out


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
