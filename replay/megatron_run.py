"""One run of a replay plan on one rank, on the real megatron.core (torch; worker processes only).

The rank does what one process of a Megatron training job does, in the order
megatron/training/{training,checkpointing}.py does it (replay/PLAN_AND_TRACE.md, "What a run
does"): build the model (the scenario's params, in order, with the plan's initial values),
DistributedDataParallel, get_megatron_optimizer() and an OptimizerParamScheduler; then, for a
resumed phase, load the previous phase's checkpoint as load_checkpoint() does; then train the
phase's steps on the plan's gradients; then save with dist_checkpointing.save() in the
dp_reshardable format. After each of these points it records the optimizer state (step
counters and hashes) as a trace event; an exception becomes an error event and ends the run.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import gc
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import checkpoint_layout as layout
from . import errors as errors_mod
from . import load_coverage
from . import model_parallel
from . import plan as plan_mod
from . import schedule as schedule_mod
from . import storage_faults as sf_mod
from . import trace_schema as ts
from . import te_emulation
from .emulation import (STEP_RECORDER, Patches, apply_coalescing_workaround, apply_te_emulation,
                        fake_te_optimizers_module, precision_aware_state)

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

_PLAN_CACHE: Dict[str, Tuple[float, Dict[str, Any]]] = {}


# Megatron's --seed default (megatron/training/arguments.py): the training loop seeds every
# generator with it (RankRun._seed).
MEGATRON_SEED = 1234


def load_plan_cached(path: str) -> Dict[str, Any]:
    mtime = os.path.getmtime(path)
    hit = _PLAN_CACHE.get(path)
    if hit and hit[0] == mtime:
        return hit[1]
    with open(path, "r", encoding="utf-8") as f:
        plan = json.load(f)
    _PLAN_CACHE.clear()  # one plan at a time is enough; plans can be large
    _PLAN_CACHE[path] = (mtime, plan)
    return plan


def _tensor_f32_bytes(t: Any) -> Optional[bytes]:
    if not isinstance(t, torch.Tensor):
        return None
    return t.detach().to(torch.float32).reshape(-1).contiguous().cpu().numpy().astype("<f4", copy=False).tobytes()


def _num(x: Any) -> Optional[float]:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            return None
        return float(x.item())
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return x
    return None


def _uses_group_step(opt: Any) -> bool:
    """TE/apex FusedAdam (and the stand-in) keep `step` in the param group."""
    return bool(getattr(opt, "ckptsim_standin", False)) or type(opt).__name__ == "FusedAdam"


def _kernel(opt: Any, group: Optional[Dict[str, Any]], param: Any) -> Optional[str]:
    """The arithmetic `opt` updates `param` with (trace_schema.KERNELS), or None if unknown."""
    if opt is None:
        return None
    if getattr(opt, "ckptsim_standin", False):
        return "standin_fused_adam"
    if type(opt).__name__ == "FusedAdam":
        return "te_fused_adam"
    if not isinstance(opt, torch.optim.Adam) and not isinstance(opt, torch.optim.AdamW):
        return None
    group = group or {}
    params = [q for q in group.get("params", []) if isinstance(q, torch.Tensor)]
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        _, foreach_default = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    except (ImportError, TypeError):  # torch's own rule, as of 2.x: foreach where all are CUDA
        foreach_default = bool(params) and all(q.is_cuda for q in params)
    device = "cuda" if param.is_cuda else "cpu"
    return ts.torch_adamw_kernel(group.get("fused"), group.get("foreach"), device, bool(foreach_default))



def expert_sharded_tensor(key: str, param: Any, sharded_offsets: Tuple[Any, ...] = ()) -> Any:
    """The ShardedTensor of an expert param's EP piece, global over EP, as GroupedMLP builds its
    weights (F/R transformer/moe/experts.py GroupedMLP.sharded_state_dict, sh_ten_build_fn:
    `ShardedTensor.from_rank_offsets(key, t, *sharded_offsets, (prepend_axis_num, ep_rank,
    ep_size), <tp axis>, replica_id=(0, 0, expt_dp_rank), prepend_axis_num=prepend_axis_num)`):
    the whole param's key, dim 0 (the stacked experts) split over the EP group at the piece's EP
    rank, and one replica per expert-DP rank (expert-DP rank 0 writes each piece). GroupedMLP's
    form, not SequentialMLP's / TEGroupedMLP's (one prepended axis of num_global_experts per local
    expert): the replay's expert param is one tensor whose dim 0 runs over the experts of every
    EP rank, as GroupedMLP's weight (viewed per expert), and its global shape stays the scenario's."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    n = len(sharded_offsets)
    return ShardedTensor.from_rank_offsets(
        key, param, *sharded_offsets,
        (n, ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size()),
        replica_id=(0, 0, ps.get_expert_data_parallel_rank()), prepend_axis_num=n)


def _training_loop_text() -> str:
    """The checkout's megatron/training/checkpointing.py ("" where it has none)."""
    import megatron

    for root in list(getattr(megatron, "__path__", [])):  # a namespace package has no __file__
        path = os.path.join(root, "training", "checkpointing.py")
        if os.path.isfile(path):
            with open(path, "r", encoding="utf-8") as f:
                return f.read()
    return ""


def _training_loop_site(text: str) -> Optional[str]:
    """'megatron/training/checkpointing.py:LINE' of the first line of the checkout's file that
    holds `text` (None where none does)."""
    for i, line in enumerate(_training_loop_text().splitlines(), 1):
        if text in line:
            return "megatron/training/checkpointing.py:%d" % i
    return None


def training_loop_reapplies_lr_bounds() -> bool:
    """Whether the checkout's megatron/training/checkpointing.py re-applies the lr bounds to the
    param groups under --override-opt_param-scheduler (schedule.reapplies_lr_bounds)."""
    return schedule_mod.reapplies_lr_bounds(_training_loop_text())


def training_loop_resets_num_steps() -> bool:
    """Whether that block also resets the scheduler's num_steps to consumed_train_samples
    (schedule.resets_num_steps)."""
    return schedule_mod.resets_num_steps(_training_loop_text())

class _TrackerError(errors_mod.TrainingLoopError):
    """read_metadata() / _get_checkpoint_format()'s errors, with their own Python type."""

    def __init__(self, py_type: str, message: str, site: str) -> None:
        super().__init__(message, site, None)
        self.py_type = py_type


class RankRun:
    """Executes job["run_index"] of job["plan_path"] as rank job["rank"]."""

    def __init__(self, job: Dict[str, Any], log: Any) -> None:
        self.job = job
        self.log = log
        self.plan = load_plan_cached(job["plan_path"])
        self.run = self.plan["runs"][job["run_index"]]
        self.rank = int(job["rank"])
        self.tp, self.pp, self.dp = model_parallel.run_sizes(self.run)
        self.world = self.tp * self.pp * self.dp
        self.tp_rank, self.dp_rank, self.pp_rank = model_parallel.place(self.rank, self.tp, self.dp)
        # Expert parallelism (the same EP size in every phase): this rank's EP rank and expert-DP
        # rank, as parallel_state numbers them (checked in _init_distributed).
        self.ep = model_parallel.scenario_ep(self.plan["scenario"])
        self.ep_rank, self.expert_dp_rank = model_parallel.expert_place(self.rank, self.tp, self.dp, self.ep)
        self.params = plan_mod.params(self.plan)
        # The params this rank's pipeline stage holds (model order), each as its TP piece.
        self.held = [self.params[i] for i in model_parallel.stage_params(self.params, self.pp, self.pp_rank)]
        self.offsets = {name: (b, e) for name, b, e in plan_mod.split_offsets(self.plan)}
        self.by_name = {p["name"]: p for p in self.params}
        self.scenario = self.plan["scenario"]
        self.samples_per_step = int(self.scenario.get("samples_per_step", 8))
        self.schedule_args: Dict[str, Any] = {}
        self.scheduler_cls: Any = None
        self.events: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.timings: Dict[str, float] = {}
        self.patches = Patches()
        self.module = self.ddp = self.opt = self.sched = None
        self.dist_ready = False
        self.unwritten: Optional[List[Dict[str, Any]]] = None  # the load's, where probed
        self.started_fresh = False  # a load that found no tracker (plans with storage faults)
        self.global_step = int(self.run.get("start_step", 0))
        # Global steps before the training loop's iteration 0 (set by the load; 0 for a job that
        # loads nothing): its saves name the global step minus it.
        self.iteration_origin = 0
        # Set by the worker: each event and each stage change is also sent as it happens, so a
        # rank that is stopped later still has its events up to there in the trace.
        self.on_event: Optional[Any] = None
        self.on_stage: Optional[Any] = None

    def _add(self, ev: Dict[str, Any]) -> None:
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def _stage(self, stage: str) -> str:
        if self.on_stage is not None:
            self.on_stage(stage)
        return stage

    # ------------------------------------------------------------------ setup
    def _init_distributed(self) -> None:
        from megatron.core import parallel_state as ps

        dev = int(self.job["device"])
        torch.cuda.set_device(dev)
        dist.init_process_group(backend=self.job["backend"], init_method=self.job["init_method"],
                                rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=float(self.job["collective_timeout_s"])))
        self.dist_ready = True
        ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
                                     expert_model_parallel_size=self.ep)
        got = (ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank(), ps.get_pipeline_model_parallel_rank())
        if got != (self.tp_rank, self.dp_rank, self.pp_rank):
            raise RuntimeError("parallel_state placed rank %d at (tp, dp, pp) ranks %r; the plan's numbering "
                               "(replay/model_parallel.py place) gives %r" % (
                                   self.rank, got, (self.tp_rank, self.dp_rank, self.pp_rank)))
        self._seed()
        got = (ps.get_expert_model_parallel_rank(), ps.get_expert_data_parallel_rank())
        if got != (self.ep_rank, self.expert_dp_rank):
            raise RuntimeError("parallel_state placed rank %d at (ep, expert dp) ranks %r; the plan's numbering "
                               "(replay/model_parallel.py expert_place) gives %r" % (
                                   self.rank, got, (self.ep_rank, self.expert_dp_rank)))

    def _seed(self) -> None:
        """Seed the generators as Megatron's training loop does after it places the ranks
        (initialize.py _set_random_seed with --seed's default 1234): Python's, numpy's and torch's
        with 1234 + 100 * the pipeline rank, and the CUDA generator through
        tensor_parallel.model_parallel_cuda_manual_seed. What draws from them (HDO.dummy_step()'s
        torch.randn_like gradients at a load) then draws the same in every run of a plan, however
        many runs a worker process made before."""
        import random

        import numpy as np
        from megatron.core import tensor_parallel

        seed = MEGATRON_SEED + 100 * self.pp_rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        if torch.cuda.device_count() > 0:
            tensor_parallel.model_parallel_cuda_manual_seed(seed)

    def _build(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.transformer.transformer_config import TransformerConfig

        sc = self.scenario
        # calculate_per_token_loss=True: DDP's gradient_scaling_factor is 1.0 and the
        # reduce-scatter sums (average_in_collective stays False): the plan's local gradients
        # are already scaled by 1/samples_per_step, as ckptsim scales them. One layer per
        # pipeline stage and one attention head per TP rank: the sizes the config checks.
        tconf = TransformerConfig(num_layers=self.pp, hidden_size=8 * self.tp, num_attention_heads=self.tp,
                                  tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
                                  pipeline_dtype=torch.bfloat16 if self.pp > 1 else None, bf16=True,
                                  params_dtype=torch.bfloat16, calculate_per_token_loss=True)
        module, inexact = self._module(tconf)
        if inexact:
            self.notes.append("initial values not exact in bf16 (rounded): %s" % ", ".join(inexact))
        bucket_size = sc.get("bucket_size")
        ddp_conf = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            # DDP keeps an explicit bucket_size only with overlap_grad_reduce (it sets None
            # otherwise); the replay switches the overlap off again once the buffers exist.
            overlap_grad_reduce=bucket_size is not None,
            overlap_param_gather=False,
            use_distributed_optimizer=True,
            bucket_size=bucket_size,
            pad_buckets_for_high_nccl_busbw=bool(sc.get("pad_buckets_for_high_nccl_busbw", False)),
            average_in_collective=False,
        )
        ddp = DistributedDataParallel(config=tconf, ddp_config=ddp_conf, module=module)
        if bucket_size is not None:
            ddp.ddp_config.overlap_grad_reduce = False
            self.notes.append("bucket_size %d: DDP built with overlap_grad_reduce=True (keeps the bucket size), "
                              "then grad sync made synchronous" % bucket_size)
        self.module, self.ddp = module, ddp
        self.schedule_args = schedule_mod.phase_arguments(sc, int(self.run.get("phase", 0)))
        self._build_optimizer(self.schedule_args)

    def _build_optimizer(self, args: Dict[str, Any]) -> None:
        """get_megatron_optimizer() over self.ddp and an OptimizerParamScheduler, both for the
        schedule arguments `args` (the run's phase's at first; the reference run builds them
        again where a --no-load-optim phase resumes, from the weights it then holds)."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer.optimizer_config import ParamKey
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        sc = self.scenario
        o = sc["optimizer"]
        hybrid = o["kind"] == "hybrid"
        prec = plan_mod.optimizer_precision(sc)
        config_args = dict(
            optimizer="adam", lr=float(args["lr"]), min_lr=float(args["min_lr"]),
            weight_decay=float(o["weight_decay"]),
            adam_beta1=float(o["betas"][0]), adam_beta2=float(o["betas"][1]), adam_eps=float(o["eps"]),
            bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=True, clip_grad=0.0,
            optimizer_cpu_offload=hybrid,
            optimizer_offload_fraction=float(o.get("offload_fraction", 0.0)) if hybrid else 0.0,
            overlap_cpu_optimizer_d2h_h2d=bool(o.get("overlap_cpu_optimizer_d2h_h2d", False)) if hybrid else False,
            # The scenario's precision_aware; always for the hybrid (Megatron's arguments require
            # --use-precision-aware-optimizer with --optimizer-cpu-offload).
            use_precision_aware_optimizer=prec["precision_aware"],
            exp_avg_dtype=_TORCH_DTYPES[prec["exp_avg_dtype"]],
            exp_avg_sq_dtype=_TORCH_DTYPES[prec["exp_avg_sq_dtype"]],
            main_params_dtype=_TORCH_DTYPES[prec["main_params_dtype"]],
            # OptimizerConfig's default is True; __post_init__ turns it off below TE 2.1.
            store_param_remainders=prec["store_param_remainders"],
        )
        if self._fakes_te_optimizers():
            # __post_init__ imports transformer_engine.pytorch.optimizers.FusedAdam (precision-aware,
            # no CPU offload): the stand-in, importable only while the config is built.
            with fake_te_optimizers_module(self.notes):
                oconf = OptimizerConfig(**config_args)
        else:
            oconf = OptimizerConfig(**config_args)
        # Param groups: exactly the scenario's wd_mult / lr_mult. An explicit (possibly empty)
        # override dict replaces Megatron's standard one (which sets wd_mult=0 for 1-D params
        # and biases). The scheduler never reads lr_mult; a group's lr comes from its own
        # max_lr/min_lr, which the override sets to the schedule's lr/min_lr times lr_mult.
        by_mults: Dict[Tuple[float, float], List[str]] = {}
        for p in self.params:
            if (p["wd_mult"], p["lr_mult"]) != (1.0, 1.0):
                by_mults.setdefault((p["wd_mult"], p["lr_mult"]), []).append(p["name"])
        overrides: Dict[Any, Dict[str, float]] = {}
        for (wd_mult, lr_mult), names in by_mults.items():
            # _get_param_groups matches ParamKey names against the DDP wrapper's
            # named_parameters(), which prefixes every name with "module.".
            overrides[ParamKey(name=tuple("module." + n for n in names))] = schedule_mod.group_override(
                wd_mult, lr_mult, args)
        self.sched = self.opt = None  # the reference run's restart: the old ones go first
        self.opt = get_megatron_optimizer(oconf, [self.ddp], config_overrides=overrides)
        self.scheduler_cls = OptimizerParamScheduler
        self.sched = OptimizerParamScheduler(self.opt, **schedule_mod.scheduler_kwargs(
            args, self.samples_per_step, schedule_mod.resume_flag(sc, int(self.run.get("phase", 0)))))

    def _fakes_te_optimizers(self) -> bool:
        """A precision-aware FusedAdam on the stand-in: the run emulates TE, with the stand-in."""
        return (self.job.get("te") == "emulated" and bool(self.job.get("standin"))
                and plan_mod.optimizer_precision(self.scenario)["te_precision_aware"])

    def _emulated_te_version(self) -> Optional[str]:
        """The TE version the emulation answers is_te_min_version() with: an emulated TE of
        te_emulation.EMULATED_TE_VERSION for a precision-aware FusedAdam on the stand-in (so that
        store_param_remainders is the scenario's); None (today's answers) for every other run."""
        return te_emulation.EMULATED_TE_VERSION if self._fakes_te_optimizers() else None

    def _module(self, tconf: Any) -> Tuple[Any, List[str]]:
        """The model: the stage's params in model order, each its TP piece of the plan's initial
        value (in the local shape), with the split a TP layer gives it: the TP attributes and,
        in the sharded state dict, the TP axis (make_sharded_tensors_for_checkpoint, as a
        ColumnParallelLinear / RowParallelLinear does). An expert param is its EP piece (rows
        split over EP on dim 0), marked `allreduce = False` before DDP is built (DDP splits the
        params into its dense and expert buffers at construction, distributed_data_parallel.py
        `getattr(param, 'allreduce', True)`), and made global over EP in the sharded state dict
        as GroupedMLP makes its weights (expert_sharded_tensor). Also the params whose value
        bf16 rounds."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes
        from megatron.core.transformer.module import MegatronModule
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        axes = {p["name"]: model_parallel.tp_axis(p) for p in self.held
                if model_parallel.tp_axis(p) >= 0 and not p["expert"]}
        experts = {p["name"] for p in self.held if p["expert"]}

        class ReplayModel(MegatronModule):
            def forward(self, x):  # never called: the replay writes gradients into main_grad
                return x

            def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
                # Every param by its dotted name (a submodule's with its path, the keys
                # MegatronModule's recursion into plain submodules gives), the param itself.
                sd: Dict[str, Any] = {n: p for n, p in self.named_parameters() if n not in experts}
                dp_cp = (metadata or {}).get("dp_cp_group") or ps.get_data_parallel_group(with_context_parallel=True)
                out = make_sharded_tensors_for_checkpoint(sd, prefix, axes, sharded_offsets,
                                                          tp_group=ps.get_tensor_model_parallel_group(),
                                                          dp_cp_group=dp_cp)
                for n, p in self.named_parameters():
                    if n in experts:
                        out[prefix + n] = expert_sharded_tensor(prefix + n, p, sharded_offsets)
                # The module's order (the dict's order is what dist_checkpointing walks).
                return {prefix + n: out[prefix + n] for n, _ in self.named_parameters()}

        module = ReplayModel(tconf)
        init = self.plan["initial_params"]
        inexact = []
        for p in self.held:
            whole = torch.frombuffer(bytearray(ts.decode_f32_bytes(init[p["name"]])), dtype=torch.float32)
            vals = self._piece(p, whole)
            dtype = torch.bfloat16 if p["dtype"] == "bf16" else torch.float32
            t = vals.to(dtype)
            if not torch.equal(t.float(), vals):
                inexact.append(p["name"])
            param = torch.nn.Parameter(t.cuda())
            if p["name"] in axes:
                set_tensor_model_parallel_attributes(param, True, axes[p["name"]], 1)
            if p["expert"]:
                # What GroupedMLP / TE's grouped linear set at EP > 1 (`not self.expert_parallel`).
                param.allreduce = False
            owner, _, leaf = p["name"].rpartition(".")
            holder = module
            for c in owner.split(".") if owner else []:  # a submodule per dotted prefix (plan.module_order)
                if c not in holder._modules:
                    holder.add_module(c, torch.nn.Module())
                holder = holder._modules[c]
            holder.register_parameter(leaf, param)
        if experts:
            self.notes.append("expert params %s: allreduce=False set before DistributedDataParallel (EP %d): DDP's "
                              "expert buffers on the expert-DP group, get_megatron_optimizer's second part"
                              % (", ".join(sorted(experts)), self.ep))
            if self.ep == 1:
                self.notes.append("EP 1 with expert params: the marking is synthetic (a real MoE layer keeps "
                                  "allreduce=True at EP 1: GroupedMLP's `not self.expert_parallel`); the runner sets "
                                  "allreduce=False by hand, so the expert part's DP group holds every DP rank")
        return module, inexact

    def _runs(self, p: Dict[str, Any]) -> model_parallel.Runs:
        """The runs of a param's whole flattened elements that this rank holds: its EP piece for
        an expert param, else its TP piece."""
        return model_parallel.element_runs(p, self.tp, self.tp_rank, self.ep, self.ep_rank)

    def _piece(self, p: Dict[str, Any], whole: Any) -> Any:
        """This rank's piece of a param's whole (flattened) value (its EP piece for an expert param,
        else its TP piece), in its local shape."""
        flat = torch.cat([whole[b:b + n] for b, n in self._runs(p)])
        return flat.reshape(model_parallel.local_shape(p, self.tp, self.ep))

    # ------------------------------------------------------------------ state
    def _chain(self) -> List[Any]:
        """The parts of the optimizer: `chained_optimizers` of the ChainedOptimizer that
        get_megatron_optimizer() always returns (0 the dense DistributedOptimizer, 1 the expert
        one where the model has expert params), or the optimizer itself."""
        chained = getattr(self.opt, "chained_optimizers", None)
        return list(chained) if chained else [self.opt]

    def _pairs(self) -> List[Tuple[int, Any, Any, Any]]:
        """(part index, the part's DistributedOptimizer, model param, the param its inner optimizer
        holds for the shard) for every shard of every part, in model order."""
        pairs = []
        for idx, dopt in enumerate(self._chain()):
            if getattr(dopt, "is_stub_optimizer", False):  # a part with no params on this rank
                continue
            pa = bool(getattr(dopt.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False))
            for mg, s16, s32 in zip(dopt.model_float16_groups, dopt.shard_float16_groups,
                                    dopt.shard_fp32_from_float16_groups):
                for mp, a, b in zip(mg, s16, s32):
                    pairs.append((idx, dopt, mp, a if pa else b))
            for mg, sg in zip(dopt.model_fp32_groups, dopt.shard_fp32_groups):
                for mp, a in zip(mg, sg):
                    pairs.append((idx, dopt, mp, a))
        order = {id(p): i for i, (_, p) in enumerate(self.module.named_parameters())}
        pairs.sort(key=lambda pr: order.get(id(pr[2]), 1 << 30))
        return pairs

    def _event(self, at: str, global_step: int, used: Optional[Dict[int, float]] = None) -> Dict[str, Any]:
        from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

        chained = len(self._chain()) > 1  # each part then names its index in the chain
        names = {id(p): n for n, p in self.module.named_parameters()}
        parts, hashes = [], {k: {} for k in ts.HASH_KINDS}
        values: Dict[str, Dict[str, Optional[str]]] = {k: {} for k in ts.HASH_KINDS}
        want_values = bool(self.job.get("values"))
        step_ids: Dict[int, int] = {}
        part_step_ids: List[Optional[int]] = []

        def put(kind: str, name: str, t: Any) -> None:
            raw = _tensor_f32_bytes(t)
            hashes[kind][name] = None if raw is None else ts.hash_f32_bytes(raw)
            if want_values:
                values[kind][name] = None if raw is None else base64.b64encode(raw).decode("ascii")

        for idx, dopt, mp, x in self._pairs():
            inner = dopt.optimizer
            # A precision-aware FusedAdam holds the master weights and its states in their own dtypes
            # (TE's or the stand-in's): the trace records the fp32 values it updates and the dtypes.
            precision_aware = bool(getattr(dopt.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False))
            name = names.get(id(mp), "?")
            r = dopt._get_model_param_range_map(mp)["param"]
            if isinstance(inner, HybridDeviceOptimizer):
                ix = inner.param_to_inner_param.get(x, x)
                if x in inner.gpu_params_map_cpu_copy:
                    sub = next((o for o in inner.cpu_optimizers
                                if any(ix is q for g in o.param_groups for q in g["params"])), None)
                    part = "HDO cpu AdamW"
                else:
                    sub = inner.gpu_optimizer
                    part = "HDO gpu FusedAdam" if _uses_group_step(sub) else "HDO gpu AdamW"
            else:
                ix, sub = x, inner
                part = "FusedAdam" if _uses_group_step(inner) else "AdamW"
            state = sub.state.get(ix, {}) if sub is not None else {}
            group = None
            if sub is not None:
                group = next((g for g in sub.param_groups if any(ix is q for q in g["params"])), None)
            step_t = None
            if _uses_group_step(sub):
                counter = _num(group.get("step")) if group is not None else None
                step_used = None
                if at == "after_step":
                    last = getattr(sub, "last_step_used", None)
                    if last is not None:
                        step_used = _num(last.get(id(ix)))
                    else:  # real TE: the group step after the update is the t it used
                        step_used = counter
            else:
                step_t = state.get("step")
                counter = _num(step_t)
                step_used = None
                if at == "after_step":
                    if used:
                        step_used = _num(used.get(id(ix)))
                    else:  # the recorder saw no torch Adam call: the counter after the update
                        step_used = counter
                        self.notes.append("step_used of torch Adam parts read from the counter after the step "
                                          "(the step recorder saw no call)")
            sid = id(step_t) if isinstance(step_t, torch.Tensor) else None
            if sid is not None:
                step_ids[sid] = step_ids.get(sid, 0) + 1
            kernel = _kernel(sub, group, ix)
            pa_state = precision_aware_state(sub, ix) if precision_aware and part == "FusedAdam" else None
            # The shard's range in the whole param: one part per run of the TP (or EP) piece it covers.
            spec = self.by_name[name]
            for b, e in model_parallel.global_ranges(self._runs(spec), int(r.start), int(r.end)):
                part_entry = {"part": part, "param": name, "range": [b, e], "step": counter, "step_used": step_used}
                if chained:
                    part_entry["chain"] = idx
                if kernel is not None:
                    part_entry["kernel"] = kernel
                if pa_state is not None and pa_state["state_dtypes"]:  # left out before any state
                    part_entry["state_dtypes"] = dict(pa_state["state_dtypes"])
                parts.append(part_entry)
                part_step_ids.append(sid)
            if pa_state is not None:
                put("master", name, pa_state["master"])
                put("exp_avg", name, pa_state["exp_avg"])
                put("exp_avg_sq", name, pa_state["exp_avg_sq"])
            else:
                put("master", name, ix)
                put("exp_avg", name, state.get("exp_avg"))
                put("exp_avg_sq", name, state.get("exp_avg_sq"))
        for part, sid in zip(parts, part_step_ids):
            part["step_aliases"] = (step_ids[sid] - 1) if sid is not None else 0
        for n, p in self.module.named_parameters():
            put("model_param", n, p)
        ev = {"rank": self.rank, "at": at, "global_step": int(global_step), "parts": parts, "hashes": hashes}
        if want_values:
            ev["values"] = values
        return ev

    # ------------------------------------------------------------------ phases of a run
    def _metadata(self, base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        from megatron.core import parallel_state as ps

        md = dict(plan_mod.save_metadata(self.scenario, int(self.run.get("phase", 0))) if base is None else base)
        md["dp_cp_group"] = ps.get_data_parallel_group(with_context_parallel=True)
        return md

    def _load(self) -> Optional[int]:
        """megatron/training/checkpointing.py load_checkpoint(), torch_dist format: the
        checkpoint's iteration (None: a plan with storage faults found no tracker, and the job
        starts from random). Under --finetune load_checkpoint() returns 0 instead ("if
        args.finetune or release: iteration = 0"); execute() does that."""
        from megatron.core import dist_checkpointing

        ckpt = self._tracker_dir() if self.job.get("crash_mode") else layout.resume_dir(self.job["load_dir"])
        if ckpt is None:
            return None
        # --no-load-optim and --finetune: load_checkpoint() requests the model only (no
        # optimizer, so no sharded_state_dict(is_loading=True), and no scheduler), and skips the
        # optimizer's (TP, PP) and sharding-type checks.
        load_optim = not schedule_mod.fresh_optimizer(self.scenario, int(self.run.get("phase", 0)))
        common = dist_checkpointing.load_common_state_dict(ckpt)
        md = dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {}
        if load_optim:
            self._check_tp_pp(common, md)
        md = self._metadata(dict(md))
        sd: Dict[str, Any] = {"checkpoint_version": 3.0}
        sd["model"] = self.module.sharded_state_dict(metadata=md)
        if load_optim:
            sd["optimizer"] = self.opt.sharded_state_dict(sd, is_loading=True, metadata=md)
        # Which requested elements the load leaves unwritten (replay/load_coverage.py): probed
        # without changing what the load gives (every probed element is restored after it).
        probe = load_coverage.Probe(sd)
        loaded = dist_checkpointing.load(sd, ckpt)
        self.unwritten = probe.finish(loaded, load_coverage.checkpoint_keys(str(ckpt)))
        if probe.unchecked:
            self.notes.append("load coverage: %d requested tensor(s) not probed (not 1-D floating, or "
                              "a factory's)" % probe.unchecked)
        iteration = int(loaded.get("iteration", common.get("iteration", 0)))
        self.ddp.load_state_dict(loaded["model"], strict=True)
        if not load_optim:
            # load_checkpoint()'s branch without the optimizer, for bf16: the main params from
            # the loaded model params; the optimizer and the scheduler stay as built (HEAD's
            # --override-opt_param-scheduler block is inside the optimizer's branch: not run).
            self.opt.reload_model_params()
            self.notes.append("--no-load-optim/--finetune: the load requested the model only; "
                              "optimizer.reload_model_params(), no optimizer or scheduler state loaded")
            torch.cuda.synchronize()
            return iteration
        self.opt.load_state_dict(loaded["optimizer"])
        # The scheduler, as load_checkpoint() does after the optimizer (a checkpoint of this
        # runner from before it saved one has none: the scheduler stays as built).
        if "opt_param_scheduler" in loaded:
            self.sched.load_state_dict(loaded["opt_param_scheduler"])
            self._override_lr_bounds(iteration)
        else:
            self.notes.append("the checkpoint holds no opt_param_scheduler")
        torch.cuda.synchronize()
        return iteration

    def _tracker_dir(self) -> Optional[str]:
        """load_checkpoint()'s way to the iteration folder in a plan with storage faults (one
        checkpoint root for every phase, as the training loop's --save/--load): read_metadata()
        and _get_checkpoint_format()'s listing, raised with the training loop's sites (the
        runner does not import megatron/training): no tracker -> None (a fresh start, "could not
        find the metadata file"); not an integer -> SystemExit; a folder that is not there ->
        FileNotFoundError."""
        root = self.job["load_dir"]
        path = os.path.join(root, layout.TRACKER)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            text = f.read()
        try:
            iteration = int(text.strip())
        except ValueError:
            raise _TrackerError("SystemExit", "ERROR: Invalid metadata file %s. Exiting (%r)" % (layout.TRACKER, text),
                                "checkpointing.py read_metadata()") from None
        d = layout.iteration_dir(root, iteration)
        if not os.path.isdir(d):
            raise _TrackerError("FileNotFoundError", "[Errno 2] No such file or directory: '%s'" % os.path.basename(d),
                                "checkpointing.py _get_checkpoint_format()")
        return d

    def _check_tp_pp(self, common: Dict[str, Any], md: Dict[str, Any]) -> None:
        """load_checkpoint()'s check of the checkpoint's (TP, PP) (from its args; (1, 1) where it
        has none) against the run's: only the model-space formats
        (DistributedOptimizer.checkpoint_fully_reshardable_formats) load at another TP or PP."""
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        ckpt_args = common.get("args")
        ckpt = (getattr(ckpt_args, "tensor_model_parallel_size", 1), getattr(ckpt_args, "pipeline_model_parallel_size", 1))
        run = (self.tp, self.pp)
        sharding_type = md.get("distrib_optim_sharding_type")
        if ckpt == run or sharding_type in getattr(DistributedOptimizer, "checkpoint_fully_reshardable_formats", ()):
            return
        raise errors_mod.TrainingLoopError(
            "(TP, PP) mismatch after resume ({} vs {} from checkpoint): not supported for DistributedOptimizer "
            "with sharding type {}. Please use `--ckpt-fully-parallel-save` flag during checkpoint saving.".format(
                run, ckpt, sharding_type),
            "checkpointing.py load_checkpoint()", _training_loop_site("mismatch_msg}: not supported"))

    def _override_lr_bounds(self, iteration: int) -> None:
        """The block of load_checkpoint() that follows the scheduler's load under
        --override-opt_param-scheduler, where the checkout's training/checkpointing.py has one
        (HEAD d98e8a64dd: every group's max_lr/min_lr := --lr/--min-lr, num_steps :=
        consumed_train_samples where they differ, then step(0); older revisions have none). The
        runner reads the checkout's file to know which. `iteration`: the checkpoint's; the
        runner saves no args, and the training loop's consumed_train_samples is the iterations
        times the global batch size."""
        if schedule_mod.resume_flag(self.scenario, int(self.run.get("phase", 0))) != "override":
            return
        if not training_loop_reapplies_lr_bounds():
            return
        for group in self.opt.param_groups:
            group["max_lr"] = float(self.schedule_args["lr"])
            group["min_lr"] = float(self.schedule_args["min_lr"])
        if training_loop_resets_num_steps():
            consumed_train_samples = int(iteration) * self.samples_per_step
            if self.sched.num_steps != consumed_train_samples:
                self.sched.num_steps = consumed_train_samples
                self.notes.append("override: the scheduler's num_steps reset to consumed_train_samples, as "
                                  "this checkout's load_checkpoint() does")
        self.sched.step(increment=0)
        self.notes.append("override: the group lr bounds re-applied from the arguments, as this "
                          "checkout's load_checkpoint() does")

    def _groups(self) -> List[Dict[str, float]]:
        """The lr and weight decay every param group holds, which the next optimizer.step() uses
        (train_step() steps the optimizer before the scheduler). Read from the optimizer the
        scheduler writes (the chained optimizer's param_groups: every group of the rank)."""
        return [{"wd_mult": float(g.get("wd_mult", 1.0)), "lr_mult": float(g.get("lr_mult", 1.0)),
                 "lr": float(g["lr"]), "weight_decay": float(g["weight_decay"])}
                for g in self.opt.param_groups]

    def _step(self, k: int) -> Dict[int, float]:
        """megatron/training/training.py train_step(): zero the grad buffers, gradients into
        main_grad (here: the plan's), finalize (grad sync), optimizer.step(), scheduler.step()."""
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()
        # The plan holds each DP rank's local gradient over the whole model: this rank takes
        # its stage's params, each its TP piece (the same elements of the whole gradient that
        # every TP rank of the DP rank sees, as a TP layer's gradient is), an expert param its
        # EP piece (the plan's expert gradient of a rank covers its EP group's tokens, so that
        # DDP's reduction over the expert-DP group alone gives the global sum).
        raw = ts.decode_f32_bytes(plan_mod.step_gradients(self.run, self.global_step + 1)[self.dp_rank])
        flat = torch.frombuffer(bytearray(raw), dtype=torch.float32)
        for spec, (_, p) in zip(self.held, self.module.named_parameters()):
            b, e = self.offsets[spec["name"]]
            p.main_grad.copy_(self._piece(spec, flat[b:e]).view(p.main_grad.shape).to(p.main_grad.device))
        self.ddp.finish_grad_sync()
        standins = [o for o in self._all_inner_optimizers() if hasattr(o, "last_step_used")]
        for o in standins:
            o.last_step_used.clear()
        STEP_RECORDER.start()
        try:
            res = self.opt.step()
            ok = bool(res[0]) if isinstance(res, tuple) else bool(res)
        finally:
            used = STEP_RECORDER.stop()
        if ok:
            self.sched.step(increment=self.samples_per_step)
        else:
            self.notes.append("optimizer.step() reported no update at step %d" % (k + 1))
        torch.cuda.synchronize()
        return used

    def _change_schedule(self, args: Dict[str, Any], steps_counted: int) -> None:
        """The uninterrupted run where a later phase resumes with other arguments: the schedule
        that should then be in force (ckptsim's reference run does the same), each group's bounds
        from it, stepped to where the run's scheduler is: `steps_counted`, the steps done since
        the run's last optimizer restart (all of them where there was none)."""
        for group in self.opt.param_groups:
            lr_mult = float(group.get("lr_mult", 1.0))
            group["max_lr"] = float(args["lr"]) * lr_mult
            group["min_lr"] = float(args["min_lr"]) * lr_mult
        self.schedule_args = args
        self.sched = self.scheduler_cls(self.opt, **schedule_mod.scheduler_kwargs(
            args, self.samples_per_step, "neither"))
        self.sched.step(increment=steps_counted * self.samples_per_step)

    def _restart_optimizer(self, global_step: int) -> None:
        """The uninterrupted run where a --no-load-optim phase resumes (before `global_step`): a
        new optimizer over the weights the run holds and a new scheduler that has counted
        nothing, both for the schedule then in force, as a job started from these weights
        builds them (ckptsim's reference run does the same: sim/driver.cpp restart_optimizer)."""
        self._build_optimizer(self.schedule_args)
        self.notes.append("reference: optimizer and scheduler built again before global step %d, where a "
                          "--no-load-optim phase resumes" % global_step)

    def _all_inner_optimizers(self) -> List[Any]:
        """The optimizers that update shards, over every part of the chain: each part's inner
        optimizer, or the hybrid's sub-optimizers (a part with no params, a stub, has none)."""
        out: List[Any] = []
        for dopt in self._chain():
            inner = getattr(dopt, "optimizer", None)
            if inner is None:
                continue
            subs = getattr(inner, "sub_optimizers", None)
            out.extend(list(subs) if subs is not None else [inner])
        return out

    def _save(self, iteration: int) -> None:
        """megatron/training/checkpointing.py save_checkpoint(), torch_dist format. `iteration`:
        the training loop's (the global step minus the phase's iteration origin)."""
        from megatron.core import dist_checkpointing

        root = self.job["save_dir"]
        ckpt = layout.iteration_dir(root, iteration)
        os.makedirs(ckpt, exist_ok=True)
        md = self._metadata()
        sd: Dict[str, Any] = {"checkpoint_version": 3.0, "iteration": int(iteration)}
        sd["model"] = self.module.sharded_state_dict(metadata=md)
        sd["optimizer"] = self.opt.sharded_state_dict(sd, metadata=md)
        sd["opt_param_scheduler"] = self.sched.state_dict()
        if (self.tp, self.pp) != (1, 1):
            # save_checkpoint() stores the arguments; load_checkpoint() reads the TP and PP sizes
            # from them (a checkpoint without them reads as (1, 1), as this runner's older ones).
            sd["args"] = argparse.Namespace(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp)
        content = {k: v for k, v in md.items() if k != "dp_cp_group"}
        faults = self.job.get("storage_faults") or []
        if faults:
            # From here on the save's writes meet the phase's storage faults (replay/storage_faults.py).
            plan = sf_mod.FaultPlan(root, [sf_mod.Fault(**f) for f in faults], self.rank, self.world,
                                    sf_mod.Counters(self.job["fault_counts"] + ".rank%d" % self.rank, len(faults)))
            hook = sf_mod.Interposer(plan, self.job["crash_marker"],
                                     lambda line: sf_mod.append_line(self.job["fault_record"], line))
            hook.install(self.patches, torch)
            self.notes.append("storage faults: open(), io.open(), os.rename(), os.replace() and torch.save() "
                              "wrapped during the save (torch.save to a checkpoint path serializes to memory and "
                              "writes the same bytes through open())")
        dist_checkpointing.save(sd, ckpt, validate_access_integrity=True, content_metadata=content)
        torch.cuda.synchronize()
        dist.barrier()  # "Wait so everyone is done (necessary)"
        if self.rank == 0:
            try:
                layout.write_tracker(root, iteration)
            except OSError as e:
                # save_checkpoint() writes the tracker itself, and the runner does not import
                # megatron/training: its error with the training loop's site, as the model names it.
                raise _TrackerError("OSError", str(e), "checkpointing.py save_checkpoint() (tracker)") from None
        dist.barrier()  # save_checkpoint()'s last barrier

    def _resumed_global_step(self, checkpoint_iteration: int) -> int:
        """The global step a load of `checkpoint_iteration` resumes at; sets the phase's iteration
        origin (schedule.resumed_iteration: from iteration 0 under --finetune)."""
        iteration, self.iteration_origin = schedule_mod.resumed_iteration(
            self.scenario, int(self.run.get("phase", 0)), checkpoint_iteration)
        if iteration != checkpoint_iteration:
            self.notes.append("--finetune: the checkpoint's iteration %d, the training loop's %d" %
                              (checkpoint_iteration, iteration))
        return self.iteration_origin + iteration

    # ------------------------------------------------------------------ driver
    def execute(self) -> Dict[str, Any]:
        stage, gs = self._stage("init"), int(self.run.get("start_step", 0))
        start = gs
        status = "completed"
        t0 = time.time()
        try:
            if self.job["te"] == "emulated":
                apply_te_emulation(self.patches, bool(self.job["standin"]), te_version=self._emulated_te_version())
            self._init_distributed()
            if self.job["coalescing_workaround"]:
                apply_coalescing_workaround(self.patches)
            self._build()
            self.timings["build_s"] = round(time.time() - t0, 3)
            if self.run.get("load"):
                stage = self._stage("load")
                t = time.time()
                it = self._load()
                self.timings["load_s"] = round(time.time() - t, 3)
                if it is None:
                    # No tracker: the training loop starts from random at iteration 0. The
                    # model's trace records no init event for such a phase, nor does this.
                    self.started_fresh = True
                    it = 0
                else:
                    it = self._resumed_global_step(it)
                    if it != gs:
                        self.notes.append("the checkpoint's global step is %d, the plan's start_step %d" % (it, gs))
                gs = it
                start = gs
                if not self.started_fresh:
                    ev = self._event("after_load", gs)
                    if self.unwritten is not None:
                        ev["unwritten"] = self.unwritten
                    self._add(ev)
            else:
                self._add(self._event("init", gs))
            stage = self._stage("train")
            t = time.time()
            reference = self.run["id"] == "reference"
            changes = dict(schedule_mod.reference_changes(self.scenario)) if reference else {}
            restarts = set(schedule_mod.reference_restarts(self.scenario)) if reference else set()
            origin = 0  # the steps done before the optimizer and scheduler were last built
            for k in range(int(self.run["steps"])):
                # ckptsim's order (sim/driver.cpp train): the change, then the restart, which
                # builds its scheduler from the schedule the change put in force.
                if gs + 1 in changes:
                    self._change_schedule(changes[gs + 1], gs - origin)
                if gs + 1 in restarts:
                    self._restart_optimizer(gs + 1)
                    origin = gs
                groups = self._groups()
                self.global_step = gs
                used = self._step(k)
                gs += 1
                ev = self._event("after_step", gs, used)
                ev["groups"] = groups
                self._add(ev)
            self.timings["train_s"] = round(time.time() - t, 3)
            if self.run.get("save"):
                stage = self._stage("save")
                t = time.time()
                self._save(gs - self.iteration_origin)
                self.timings["save_s"] = round(time.time() - t, 3)
                self._add(self._event("at_save", gs))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - CheckpointException derives from BaseException
            status = "failed"
            self._add(errors_mod.error_event(e, self.rank, stage, gs))
        self.timings["run_s"] = round(time.time() - t0, 3)
        return {"status": status, "events": self.events, "notes": self.notes + self.patches.notes,
                "timings": self.timings, "started_fresh": self.started_fresh, "start_step": start}

    def cleanup(self) -> None:
        self.patches.restore()
        try:
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
        except Exception:  # noqa: BLE001
            pass
        if self.dist_ready:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        self.module = self.ddp = self.opt = self.sched = None
        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
