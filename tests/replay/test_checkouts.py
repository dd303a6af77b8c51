import json
import os

import pytest

from replay import checkouts as co


def _checkout(root, label, repo=None, commit=None):
    d = os.path.join(str(root), label)
    os.makedirs(os.path.join(d, "megatron", "core"))
    if repo:
        with open(os.path.join(d, co.STAMP), "w") as f:
            json.dump({"repo": repo, "commit": commit, "label": label}, f)
    return d


REVS = {
    "upstream-2874": {"upstream": {"repo": "NVIDIA/Megatron-LM", "commit": "f4502eb1c92f77e0ed190cac00293e8ac192543b"}},
    "miles-main": {"upstream": {"repo": "radixark/Megatron-LM", "commit": "2e64d788b"}},
    "fix-complete": {"upstream": None},
}


def test_parse_megatron_args(tmp_path):
    d = _checkout(tmp_path, "plain")
    assert co.parse_megatron_args([d]) == (d, {})
    assert co.parse_megatron_args(["miles-main=/x", d]) == (d, {"miles-main": "/x"})
    with pytest.raises(co.CheckoutError):
        co.parse_megatron_args(["a=/x", "a=/y"])
    with pytest.raises(co.CheckoutError):
        co.parse_megatron_args(["/x", "/y"])
    with pytest.raises(co.CheckoutError):
        co.parse_megatron_args(["=/x"])


def test_resolve_by_stamp_prefix_then_default(tmp_path):
    root = os.path.join(str(tmp_path), "root")
    nv = _checkout(root, "nv-f4502eb1c9", "NVIDIA/Megatron-LM", "f4502eb1c92f77e0ed190cac00293e8ac192543b")
    rx = _checkout(root, "rx-2e64d788b6", "radixark/Megatron-LM", "2e64d788b67fe8155774200c87606e1e449c494b")
    _checkout(root, "unstamped")
    found, missing = co.resolve(REVS, None, {}, root)
    assert found == {"upstream-2874": nv, "miles-main": rx}
    assert "fix-complete" in missing and "names no upstream commit" in missing["fix-complete"]
    graft = _checkout(tmp_path, "graft")
    found, missing = co.resolve(REVS, None, {"fix-complete": graft}, root)
    assert found["fix-complete"] == graft and not missing
    default = _checkout(tmp_path, "default")
    found, missing = co.resolve(REVS, default, {}, None)
    assert set(found.values()) == {default} and not missing


def test_resolve_reports_missing_commits(tmp_path):
    root = os.path.join(str(tmp_path), "root")
    _checkout(root, "nv-d98e8a64dd", "NVIDIA/Megatron-LM", "d98e8a64ddf34856e74b24714e3bedb2f5a39553")
    found, missing = co.resolve(REVS, None, {}, root)
    assert not found
    assert "f4502eb1c92f" in missing["upstream-2874"] and "--megatron upstream-2874=DIR" in missing["upstream-2874"]


def test_a_named_folder_must_hold_megatron_core(tmp_path):
    with pytest.raises(co.CheckoutError):
        co.resolve(REVS, str(tmp_path), {}, None)
    with pytest.raises(co.CheckoutError):
        co.resolve(REVS, None, {"miles-main": str(tmp_path)}, None)
    with pytest.raises(co.CheckoutError):
        co.resolve(REVS, None, {}, os.path.join(str(tmp_path), "absent"))


def test_describe_prefers_the_stamp(tmp_path):
    d = _checkout(tmp_path, "nv", "NVIDIA/Megatron-LM", "f4502eb1c92f77e0ed190cac00293e8ac192543b")
    info = co.describe(d, None)
    assert info["commit_source"] == "stamp" and info["commit"].startswith("f4502eb1c9") and info["label"] == "nv"
    plain = _checkout(tmp_path, "plain")
    info = co.describe(plain, {"repo": "NVIDIA/Megatron-LM", "commit": "abc1234"})
    assert info["commit_source"] in ("plan", "git")
