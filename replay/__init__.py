"""ckptsim replay: run ckptsim scenarios on a real Megatron-LM checkout and record a trace.

Torch-free modules (importable and tested without torch): plan, trace_schema, checkouts,
errors, compare, synthetic_plan, cli, coordinator. Only worker, megatron_run and emulation
import torch (and megatron), and only in the worker processes on the GPU machine.

The interface with ckptsim (the replay plan and the trace) is specified in
replay/PLAN_AND_TRACE.md; trace_schema.py and plan.py are its executable form.
"""

__all__ = ["__version__"]
__version__ = "1"
