"""The torch-free parts of the TE emulation (replay/emulation.py applies them in the workers):
the Transformer Engine version an emulated TE answers with, Megatron's is_te_min_version()
comparison, the names of the optimizer-state dtypes in the trace, and a temporary sys.modules
entry. Standard library only, so that CI tests them without torch.

Why a version at all: Megatron asks is_te_min_version() twice on the precision-aware path of TE's
FusedAdam (megatron/core/optimizer/optimizer_config.py __post_init__: "2.1.0", below which it turns
store_param_remainders off; megatron/core/optimizer/__init__.py
_get_megatron_optimizer_based_on_param_groups: "2.1.0.dev0", below which it does not pass
store_param_remainders to FusedAdam). Without TE Megatron answers False (or raises TypeError on a
version of None), so a precision-aware FusedAdam scenario gets an emulated TE of
EMULATED_TE_VERSION: the first release with both remainders (TE #1408, v2.1) and bf16 moments
(TE #1640, v2.3).
"""

from __future__ import annotations

import contextlib
import re
import sys
import types
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

EMULATED_TE_VERSION = "2.3.0"

# The module whose FusedAdam OptimizerConfig.__post_init__ imports and inspects for a
# precision-aware optimizer without CPU offload.
TE_OPTIMIZERS_MODULE = "transformer_engine.pytorch.optimizers"

# A PEP 440 subset: release, optional a/b/rc pre-release, .postN, .devN, and a local label (ignored).
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)"
                      r"(?:[-_.]?(a|b|rc)(\d+))?"
                      r"(?:[-_.]?post(\d+))?"
                      r"(?:[-_.]?dev(\d+))?"
                      r"(?:\+[0-9a-z]+(?:[-_.][0-9a-z]+)*)?$", re.IGNORECASE)
_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}


def version_key(text: str) -> Tuple[Any, ...]:
    """A sort key of a version string in PEP 440 order (packaging.version.Version's, for the forms
    _VERSION accepts): trailing zeros of the release do not count ("2.3" == "2.3.0"); X.devN <
    X.aN < X.bN < X.rcN < X < X.postN; a .devN sorts before the release (or pre/post) it is
    attached to. ValueError for anything else."""
    m = _VERSION.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError("not a version this emulation compares: %r" % (text,))
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre = None if m.group(2) is None else (_PRE_ORDER[m.group(2).lower()], int(m.group(3)))
    post = None if m.group(4) is None else int(m.group(4))
    dev = None if m.group(5) is None else int(m.group(5))
    if pre is None and post is None and dev is not None:
        pre_key: Tuple[int, int] = (-1, 0)  # 2.1.0.dev0 comes before 2.1.0a0
    elif pre is None:
        pre_key = (3, 0)  # a release comes after its pre-releases
    else:
        pre_key = pre
    post_key = (0, 0) if post is None else (1, post)
    dev_key = (1, 0) if dev is None else (0, dev)
    return (tuple(release), pre_key, post_key, dev_key)


def te_min_version(installed: str, version: str, check_equality: bool = True) -> bool:
    """megatron/core/utils.py is_te_min_version() for a TE of version `installed`:
    installed >= version (installed > version with check_equality False)."""
    a, b = version_key(installed), version_key(version)
    return a >= b if check_equality else a > b


def is_te_min_version_of(installed: str) -> Callable[..., bool]:
    """A stand-in for Megatron's is_te_min_version(version, check_equality=True) that answers as
    a TE of version `installed` would."""
    version_key(installed)  # fail now, not at Megatron's call

    def is_te_min_version(version: str, check_equality: bool = True) -> bool:
        return te_min_version(installed, version, check_equality)

    is_te_min_version.ckptsim_emulated_te_version = installed  # type: ignore[attr-defined]
    return is_te_min_version


# The dtype of an optimizer-state tensor as the trace names it (a part's "state_dtypes"), by
# str(torch.dtype).
_DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
                "torch.int16": "int16"}


def dtype_name(torch_dtype: Any) -> str:
    """"fp32", "bf16", "fp16" or "int16" for those torch dtypes (or their str()); any other dtype
    as str() gives it, which the trace validator rejects (a runner bug to see, not to hide)."""
    text = str(torch_dtype)
    return _DTYPE_NAMES.get(text, text)


def fake_module(name: str, **attrs: Any) -> types.ModuleType:
    """A module object named `name` with these attributes, and no __path__ (not a package)."""
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__dict__["ckptsim_fake"] = True
    return mod


@contextlib.contextmanager
def sys_modules_entry(name: str, module: types.ModuleType) -> Iterator[types.ModuleType]:
    """sys.modules[name] is `module` inside the block; afterwards whatever was there before (or
    nothing). Only `name` itself is registered: `from a.b.c import X` finds a.b.c in sys.modules
    without importing a or a.b, so `import a` (what Megatron's get_te_version() and HAVE_TE
    checks do for transformer_engine) still fails inside the block and nothing outside it sees
    the entry."""
    missing = object()
    saved: Optional[Any] = sys.modules.get(name, missing)
    sys.modules[name] = module
    try:
        yield module
    finally:
        if saved is missing:
            if sys.modules.get(name) is module:
                del sys.modules[name]
        else:
            sys.modules[name] = saved


def describe_fake(name: str, attrs: Dict[str, str]) -> str:
    """The trace note for a fake module: what was faked, where, for how long."""
    return ("te emulated: sys.modules[%r] held a fake module (%s) only while OptimizerConfig(...) was built "
            "(its precision-aware check imports FusedAdam from it and inspects the signature); its parent "
            "packages were not registered, so `import transformer_engine` kept failing"
            % (name, ", ".join("%s = %s" % kv for kv in sorted(attrs.items()))))
