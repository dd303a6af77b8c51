"""The torch-free parts of the TE emulation (replay/te_emulation.py): the emulated TE's
is_te_min_version(), the trace's state dtype names, and the temporary sys.modules entry that the
precision-aware OptimizerConfig imports FusedAdam from."""

import importlib
import sys

import pytest

from replay import te_emulation as te


@pytest.mark.parametrize("smaller,larger", [
    ("2.1.0.dev0", "2.1.0"),      # Megatron's "2.1.0.dev0" question: a dev release comes first
    ("2.1.0.dev0", "2.1.0a0"),
    ("2.1.0a1", "2.1.0b0"),
    ("2.1.0b2", "2.1.0rc1"),
    ("2.1.0rc1", "2.1.0"),
    ("2.1.0", "2.1.0.post1"),
    ("2.1.0.post1.dev3", "2.1.0.post1"),
    ("2.2.9", "2.3.0"),
    ("2.3.0", "2.3.1"),
    ("2.3.0", "2.10.0"),          # numeric, not string, order
    ("2.3.0", "2.4.0.dev0"),
    ("1.13.0+cu12", "2.1"),
])
def test_version_order_is_pep440s(smaller, larger):
    assert te.version_key(smaller) < te.version_key(larger)
    assert te.te_min_version(larger, smaller) and not te.te_min_version(smaller, larger)


def test_trailing_zeros_and_local_labels_do_not_count():
    assert te.version_key("2.3") == te.version_key("2.3.0") == te.version_key("2.3.0.0")
    assert te.version_key("2.3.0+git1234") == te.version_key("2.3.0")


@pytest.mark.parametrize("text", ["", "two", "2.3.0-beta", "2..3", "2.3.0.dev", None])
def test_what_is_not_a_version_is_an_error(text):
    with pytest.raises(ValueError):
        te.version_key(text)


def test_the_emulated_te_answers_megatrons_two_questions():
    is_te_min_version = te.is_te_min_version_of(te.EMULATED_TE_VERSION)
    assert is_te_min_version("2.1.0")  # optimizer_config.py: keep store_param_remainders
    assert is_te_min_version("2.1.0.dev0")  # optimizer/__init__.py: pass it to FusedAdam
    assert is_te_min_version("2.3.0") and not is_te_min_version("2.3.0", check_equality=False)
    assert not is_te_min_version("2.3.1") and not is_te_min_version("2.4.0.dev0")
    older = te.is_te_min_version_of("2.0.0")  # before remainders: Megatron turns them off
    assert not older("2.1.0") and not older("2.1.0.dev0")
    with pytest.raises(ValueError):
        te.is_te_min_version_of("latest")


def test_state_dtype_names():
    assert [te.dtype_name(d) for d in ("torch.float32", "torch.bfloat16", "torch.float16", "torch.int16")] == [
        "fp32", "bf16", "fp16", "int16"]
    assert te.dtype_name("torch.uint8") == "torch.uint8"  # left for the trace validator to reject


class _FakeFusedAdam:
    def __init__(self, params, *, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                 use_decoupled_grad=False):
        pass


def test_the_fake_module_is_importable_only_inside_the_block_and_alone():
    name = "ckptsim_fake_te.pytorch.optimizers"  # not a real package anywhere
    assert name not in sys.modules
    mod = te.fake_module(name, FusedAdam=_FakeFusedAdam)
    with te.sys_modules_entry(name, mod):
        # What OptimizerConfig.__post_init__ does: a from-import, then the signature.
        namespace = {}
        exec("from ckptsim_fake_te.pytorch.optimizers import FusedAdam as Adam", namespace)
        assert namespace["Adam"] is _FakeFusedAdam
        assert importlib.import_module(name) is mod
        # The parent packages are not registered: a check for the package itself still fails.
        with pytest.raises(ImportError):
            importlib.import_module("ckptsim_fake_te")
        assert "ckptsim_fake_te" not in sys.modules and "ckptsim_fake_te.pytorch" not in sys.modules
    assert name not in sys.modules
    with pytest.raises(ImportError):
        exec("from ckptsim_fake_te.pytorch.optimizers import FusedAdam", {})


def test_the_entry_restores_what_was_there_even_after_an_exception():
    name = "ckptsim_fake_te_restore"
    before = te.fake_module(name, marker=1)
    sys.modules[name] = before
    try:
        with pytest.raises(RuntimeError):
            with te.sys_modules_entry(name, te.fake_module(name, marker=2)):
                assert sys.modules[name].marker == 2
                raise RuntimeError("--use-precision-aware-optimizer requires FusedAdam ...")
        assert sys.modules[name] is before
    finally:
        sys.modules.pop(name, None)


def test_the_note_says_what_was_faked():
    note = te.describe_fake(te.TE_OPTIMIZERS_MODULE, {"FusedAdam": "replay.emulation.StandinFusedAdam"})
    assert "'transformer_engine.pytorch.optimizers'" in note and "FusedAdam = replay.emulation.StandinFusedAdam" in note
    assert "only while OptimizerConfig(...) was built" in note
