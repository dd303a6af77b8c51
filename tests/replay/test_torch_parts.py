"""The parts of the replay that need torch (the stand-in FusedAdam) or a GPU with a Megatron
checkout (the real replay). They skip, with the reason, where those are absent (CPU CI has no
torch of a recent enough version and no GPU)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, synthetic, write_json

torch = pytest.importorskip("torch", reason="torch is not installed (the torch-free parts are tested elsewhere)")
np = pytest.importorskip("numpy", reason="numpy is not installed")

from replay import emulation  # noqa: E402  (imports torch)


def _np_te_update(p, g, m, v, lr, betas, eps, wd, t):
    s = emulation.te_scalars(lr, betas, eps, wd, t, True)
    f = np.float32
    m = f(s["beta1"]) * m + f(s["omb1"]) * g
    v = f(s["beta2"]) * v + (f(s["omb2"]) * g) * g
    denom = np.sqrt(v / f(s["bc2"])) + f(s["eps"])
    p = p - f(s["lr"]) * ((m / f(s["bc1"])) / denom + f(s["weight_decay"]) * p)
    return p, m, v


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_standin_matches_the_float32_reference_bitwise(device):
    rng = np.random.default_rng(1)
    p0 = (rng.integers(-32, 33, 257) / 64).astype(np.float32)
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()).to(device))
    opt = emulation.StandinFusedAdam([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    rp, rm, rv = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t in range(1, 6):
        g = (rng.integers(-1023, 1024, 257) * 2.0 ** -16).astype(np.float32)
        p.grad = torch.from_numpy(g.copy()).to(device)
        opt.step()
        rp, rm, rv = _np_te_update(rp, g, rm, rv, 0.01, (0.9, 0.95), 1e-8, 0.1, t)
        assert opt.param_groups[0]["step"] == t and opt.last_step_used[id(p)] == t
    st = opt.state[p]
    assert np.array_equal(p.detach().cpu().numpy().view(np.uint32), rp.view(np.uint32))
    assert np.array_equal(st["exp_avg"].cpu().numpy().view(np.uint32), rm.view(np.uint32))
    assert np.array_equal(st["exp_avg_sq"].cpu().numpy().view(np.uint32), rv.view(np.uint32))


def test_standin_group_step_lazy_state_and_load():
    a = torch.nn.Parameter(torch.zeros(4))
    b = torch.nn.Parameter(torch.zeros(3))
    opt = emulation.StandinFusedAdam([{"params": [a]}, {"params": [b]}, {"params": []}])
    a.grad = torch.ones(4)
    opt.step()  # b has no grad: its state is created, it is not updated; its group still counts
    assert [g.get("step") for g in opt.param_groups] == [1, 1, None]
    assert set(opt.state[b]) == {"exp_avg", "exp_avg_sq"} and torch.equal(b.detach(), torch.zeros(3))
    assert id(b) not in opt.last_step_used
    sd = opt.state_dict()
    old = opt.state[a]["exp_avg"]
    opt.load_state_dict(sd)
    assert opt.state[a]["exp_avg"] is not old and torch.equal(opt.state[a]["exp_avg"], old)
    assert opt.param_groups[0]["step"] == 1
    sd = opt.state_dict()
    sd["state"][0]["step"] = torch.tensor(5.0)
    with pytest.raises(KeyError):
        opt.load_state_dict(sd)
    with pytest.raises(NotImplementedError):
        emulation.StandinFusedAdam([a], master_weights=True)
    with pytest.raises(RuntimeError):
        emulation.StandinFusedAdam([a], amsgrad=True)


def test_patches_restore():
    import types

    m = types.ModuleType("m")
    m.x = 1
    with emulation.Patches() as p:
        p.set(m, "x", 2)
        p.set(m, "y", 3)
        assert (m.x, m.y) == (2, 3)
    assert m.x == 1 and not hasattr(m, "y")


def _megatron_root():
    root = os.environ.get("CKPTSIM_MEGATRON_ROOT", os.path.join(ROOT, ".megatron"))
    return root if os.path.isdir(root) else None


@pytest.mark.gpu
def test_real_replay_step_reset(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the real replay runs on a GPU machine")
    root = _megatron_root()
    if root is None:
        pytest.skip("no Megatron archives: run replay/fetch-megatron.sh or set CKPTSIM_MEGATRON_ROOT")
    plan = write_json(tmp_path, "b1.plan.json", synthetic("b1-step-reset-minimal"))
    out = os.path.join(str(tmp_path), "t.json")
    r = subprocess.run([sys.executable, "-m", "replay", "run", "--plan", plan, "--megatron-root", root, "--out", out,
                        "--emulate-te", "--work-dir", os.path.join(str(tmp_path), "w")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        t = json.load(f)
    ph1 = [x for x in t["runs"] if x["id"] == "phase1"][0]
    if ph1["status"] == "skipped" and "checkout" in ph1.get("skipped_reason", ""):
        pytest.skip("the plan's checkout is not under %s: %s" % (root, ph1["skipped_reason"]))
    loads = [e for e in ph1["events"] if e["at"] == "after_load"]
    assert loads and all(p["step"] == 1.0 for e in loads for p in e["parts"])
