"""The error event of an exception raised inside a Megatron-like package folder. The module under
megatron/ here is a small merge() written for the test (not Megatron's): what matters is the
frame's file path, function name and its `key` local."""

import importlib.util
import os
import textwrap

from replay import errors


class _Dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


def _load_fake(tmp_path):
    d = os.path.join(str(tmp_path), "ckout", "megatron", "core", "dist_checkpointing")
    os.makedirs(d)
    path = os.path.join(d, "dict_utils.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent('''
            def merge(x1, x2, key=()):
                if isinstance(x1, dict) and isinstance(x2, dict):
                    for k, v2 in x2.items():
                        if k not in x1:
                            x1[k] = v2
                        else:
                            x1[k] = merge(x1[k], v2, key=key + (k,))
                elif isinstance(x1, list) and isinstance(x2, list):
                    if len(x1) != len(x2):
                        raise ValueError("Cannot merge two lists with different lengths (%d and %d)" % (len(x1), len(x2)))
                    for i, v2 in enumerate(x2):
                        x1[i] = merge(x1[i], v2, key=key + (i,))
                else:
                    raise ValueError("Duplicate non-dict and non-list values encountered: `%s` and `%s` (at level %s)" % (x1, x2, key))
                return x1
            '''))
    spec = importlib.util.spec_from_file_location("fake_dict_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_duplicate_leaf_gives_site_and_key_path(tmp_path):
    mod = _load_fake(tmp_path)
    dt = (_Dtype("bfloat16"), _Dtype("float32"))
    a = {"optimizer": {"param_state": {0: {dt: [[{"step": 5.0}]]}}}}
    b = {"optimizer": {"param_state": {0: {dt: [[{"step": 1.0}]]}}}}
    try:
        mod.merge(a, b)
    except ValueError as e:
        ev = errors.error_event(e, rank=0, stage="load", global_step=5)
    assert ev["py_type"] == "ValueError" and ev["stage"] == "load" and ev["global_step"] == 5
    assert ev["site"] == "dict_utils.py merge()"
    assert ev["site_line"].startswith("megatron/core/dist_checkpointing/dict_utils.py:")
    assert ev["merge_path"] == ["'optimizer'", "'param_state'", "0", "(torch.bfloat16, torch.float32)", "0", "0",
                                "'step'"]
    assert ev["merge_kind"] == "duplicate_leaf"
    assert "Traceback" in ev["traceback"]


def test_list_length_mismatch(tmp_path):
    mod = _load_fake(tmp_path)
    try:
        mod.merge({"optimizer": {"param_state": [[1, 2, 3]]}}, {"optimizer": {"param_state": [[1]]}})
    except ValueError as e:
        ev = errors.error_event(e, rank=1, stage="load")
    assert ev["merge_kind"] == "list_length_mismatch"
    assert ev["merge_path"] == ["'optimizer'", "'param_state'", "0"]


def test_exception_outside_megatron_has_no_site():
    try:
        raise KeyError("master_param")
    except KeyError as e:
        ev = errors.error_event(e, rank=2, stage="save", with_traceback=False)
    assert ev["site"] == "" and ev["site_line"] is None and ev["merge_path"] is None
    assert ev["message"] == "'master_param'" and "traceback" not in ev


def test_package_relative_paths():
    assert errors._package_relative("/w/.megatron/nv-f4502eb1c9/megatron/core/x/y.py") == "megatron/core/x/y.py"
    assert errors._package_relative("/w/rx/miles_megatron_plugins/a.py") == "miles_megatron_plugins/a.py"
    assert errors._package_relative("/usr/lib/python3/torch/optim/adam.py") is None


def test_long_messages_are_cut():
    try:
        raise RuntimeError("x" * 10000)
    except RuntimeError as e:
        ev = errors.error_event(e, 0, "train")
    assert len(ev["message"]) < 4100 and "more characters" in ev["message"]


def test_peer_aborted_event_is_secondary():
    ev = errors.peer_aborted_event(3, "load", "stopped after another rank failed")
    assert ev["py_type"] == "PeerAborted" and ev["secondary"] is True and ev["stage"] == "load"


def _load_standin(tmp_path):
    """A fake replay/emulation.py whose StandinFusedAdam asserts as TE's set_scaled_state does,
    called from a fake Megatron frame; and a helper of another class in the same file."""
    root = os.path.join(str(tmp_path), "ckout")
    os.makedirs(os.path.join(root, "replay"))
    os.makedirs(os.path.join(root, "megatron", "core", "optimizer"))
    standin = os.path.join(root, "replay", "emulation.py")
    with open(standin, "w") as f:
        f.write(textwrap.dedent('''
            class StandinFusedAdam:
                def set_scaled_state(self, param, state_name, value):
                    assert value.dtype == "int16"

            class Other:
                def set_scaled_state(self, param, state_name, value):
                    raise AttributeError("'bool' object has no attribute 'dtype'")
            '''))
    caller = os.path.join(root, "megatron", "core", "optimizer", "distrib_optimizer.py")
    with open(caller, "w") as f:
        f.write(textwrap.dedent('''
            def _set_main_param_and_optimizer_states(opt, value):
                opt.set_scaled_state(None, "master_param", value)
            '''))
    mods = []
    for name, path in (("fake_emulation", standin), ("fake_distopt", caller)):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods


class _Value:
    dtype = "float32"


# The stand-in's frame stands for TE's FusedAdam frame, named as the model names it; a frame of
# another class in the stand-in's file does not. Mutations caught: the stand-in's frames skipped
# (the site is distrib_optimizer.py's, as the device run of 2026-12-05 showed), any class of
# emulation.py counted.
def test_a_standin_fused_adam_frame_is_named_as_te_fused_adam(tmp_path):
    emulation, distopt = _load_standin(tmp_path)
    try:
        distopt._set_main_param_and_optimizer_states(emulation.StandinFusedAdam(), _Value())
    except AssertionError as e:
        ev = errors.error_event(e, rank=0, stage="load")
    assert ev["site"] == "fused_adam.py FusedAdam.set_scaled_state()"
    assert ev["site_line"].startswith("transformer_engine/pytorch/optimizers/fused_adam.py (stand-in: replay/emulation.py:")
    try:
        distopt._set_main_param_and_optimizer_states(emulation.Other(), _Value())
    except AttributeError as e:
        ev = errors.error_event(e, rank=0, stage="load")
    assert ev["site"] == "distrib_optimizer.py _set_main_param_and_optimizer_states()"
    assert ev["site_line"].startswith("megatron/core/optimizer/distrib_optimizer.py:")
