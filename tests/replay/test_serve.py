"""`python -m replay serve` against the fake worker (tests/replay/fake_worker.py): the protocol
on stdin/stdout, warm pools shared by the requests, errors that do not end the server, exit,
SIGTERM and bad arguments. Every read has a timeout, so a broken server fails a test instead
of hanging it."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from replay import trace_schema as ts

from helpers import FAKE_PYTHON, ROOT, synthetic, write_json

READ_TIMEOUT = 60.0


class Serve:
    """A `python -m replay serve` process: requests to its stdin, its stdout lines collected by
    a thread (all of them, for the only-protocol check), its stderr drained by another."""

    def __init__(self, tmp_path, extra=(), env_cfg=None, checkout=True):
        self.meg = os.path.join(str(tmp_path), "meg")
        os.makedirs(os.path.join(self.meg, "megatron", "core"), exist_ok=True)
        self.work = os.path.join(str(tmp_path), "work")
        cmd = [sys.executable, "-m", "replay", "serve", "--python", FAKE_PYTHON, "--emulate-te",
               "--work-dir", self.work, "--abort-grace", "1.5"]
        if checkout:
            cmd += ["--megatron", self.meg]
        cmd += list(extra)
        env = dict(os.environ, FAKE_REPLAY=json.dumps(env_cfg or {}),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=ROOT, env=env)
        self.stdout_lines = []
        self.stderr_lines = []
        self._q = queue.Queue()
        self._threads = [threading.Thread(target=self._pump_stdout, daemon=True),
                         threading.Thread(target=self._pump_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _pump_stdout(self):
        for line in self.proc.stdout:
            self.stdout_lines.append(line)
            self._q.put(line)
        self._q.put(None)  # EOF: a read after the last line fails at once

    def _pump_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def read(self, timeout=READ_TIMEOUT):
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no answer from serve within %.0f s; stderr:\n%s"
                                 % (timeout, "".join(self.stderr_lines[-40:]))) from None
        if line is None:
            self._q.put(None)
            raise AssertionError("serve closed its stdout (rc %s); stderr:\n%s"
                                 % (self.proc.poll(), "".join(self.stderr_lines[-40:])))
        return json.loads(line)

    def send(self, obj):
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout=READ_TIMEOUT):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("serve did not exit within %.0f s; stderr:\n%s"
                                 % (timeout, "".join(self.stderr_lines[-40:]))) from None
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def worker_logs(self):
        d = os.path.join(self.work, "logs")
        return sorted(n for n in os.listdir(d) if n.startswith("worker-")) if os.path.isdir(d) else []

    def live_workers(self):
        """Pids of running Python processes whose command line names this test's checkout (its
        workers)."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
                with open("/proc/%s/stat" % pid) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                exe = os.path.basename(os.readlink("/proc/%s/exe" % pid))
            except OSError:
                continue
            # Only the interpreter itself: on the way to it (fake_python's sh, `env`, a pyenv
            # shim's bash) other processes carry the same arguments for a moment.
            if not exe.startswith("python"):
                continue
            if self.meg.encode() in argv and b"--index" in argv and state != "Z":
                out.append(int(pid))
        return out

    def wait_for_workers(self, n, timeout=30.0):
        """The pids of this test's n workers, once all n run (a worker seen once is kept: while it
        execs from fake_python to python its command line can read empty)."""
        seen = set()
        deadline = time.time() + timeout
        while len(seen) < n and time.time() < deadline:
            seen.update(self.live_workers())
            time.sleep(0.05)
        assert len(seen) == n, "%d workers run, not %d" % (len(seen), n)
        return sorted(seen)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(**kw):
        s = Serve(tmp_path, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def _plan(tmp_path, name):
    return write_json(tmp_path, "%s.plan.json" % name, synthetic(name))


def _trace(path):
    with open(path) as f:
        return json.load(f)


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _hello(s):
    h = s.read()
    assert h["type"] == "hello" and h["ok"] is True, h
    assert h["pid"] == s.proc.pid and h["work_dir"] == os.path.abspath(s.work)
    return h


def test_two_requests_answered_in_order_by_the_same_pools(tmp_path, serve):
    s = serve()
    _hello(s)
    p1, p2 = _plan(tmp_path, "bug2-step-reset-dp2-to-4"), _plan(tmp_path, "bug1-duplicate-leaf-dp2-to-2")
    t1, t2 = os.path.join(str(tmp_path), "out", "one.trace.json"), os.path.join(str(tmp_path), "two.trace.json")
    # both sent at once: answered one after the other, in order
    s.send({"id": "r1", "plan": p1, "out": t1})
    s.send({"id": 2, "plan": p2, "out": t2})
    a1, a2 = s.read(), s.read()
    assert (a1["type"], a1["id"], a1["trace"]) == ("done", "r1", t1), a1
    assert (a2["type"], a2["id"], a2["trace"]) == ("done", 2, t2), a2
    assert a1["schema_problems"] == [] and a2["schema_problems"] == []
    assert isinstance(a1["seconds"], float) and a1["seconds"] >= 0
    tr1, tr2 = _trace(t1), _trace(t2)
    assert ts.validate_trace(tr1) == [] and ts.validate_trace(tr2) == []
    assert tr1["scenario"] == "bug2-step-reset-dp2-to-4" and tr2["scenario"] == "bug1-duplicate-leaf-dp2-to-2"
    assert [r["status"] for r in tr1["runs"]] == ["completed"] * 3
    assert [r["status"] for r in tr2["runs"]] == ["completed"] * 3
    assert not os.path.exists(t1 + ".tmp") and not os.path.exists(t2 + ".tmp")
    # one pool of 4 workers (DP 4 is the most) served both plans: no worker was started twice
    assert len(s.worker_logs()) == 4, s.worker_logs()
    s.send({"cmd": "exit"})
    assert s.wait() == 0
    # stdout held the protocol and nothing else; the coordinator's lines went to stderr
    assert len(s.stdout_lines) == 3
    for line in s.stdout_lines:
        assert line.endswith("\n") and isinstance(json.loads(line), dict) and "type" in json.loads(line), line
    assert any("phase1" in line and "completed" in line for line in s.stderr_lines)


def test_a_bad_request_is_answered_and_the_next_one_still_works(tmp_path, serve):
    s = serve()
    _hello(s)
    missing = os.path.join(str(tmp_path), "no-such.plan.json")
    s.send({"id": "bad", "plan": missing, "out": os.path.join(str(tmp_path), "bad.trace.json")})
    s.send("this is not json")
    s.send({"id": 7, "plan": missing})
    s.send({"cmd": "restart"})
    good = os.path.join(str(tmp_path), "good.trace.json")
    s.send({"id": "good", "plan": _plan(tmp_path, "torch-adamw-resume-asserts"), "out": good})
    a = s.read()
    assert (a["type"], a["id"]) == ("error", "bad") and "cannot read" in a["message"] and missing in a["message"]
    assert "traceback" not in a  # an expected error, not a bug
    a = s.read()
    assert (a["type"], a["id"]) == ("error", None) and "not a JSON line" in a["message"]
    a = s.read()
    assert (a["type"], a["id"]) == ("error", 7) and "lacks out" in a["message"]
    a = s.read()
    assert a["type"] == "error" and "unknown cmd" in a["message"]
    a = s.read()
    assert (a["type"], a["id"]) == ("done", "good"), a
    assert ts.validate_trace(_trace(good)) == []
    assert not os.path.exists(os.path.join(str(tmp_path), "bad.trace.json"))
    s.proc.stdin.close()  # EOF ends the server too
    assert s.wait() == 0


def test_a_crashed_worker_is_replaced_for_the_next_request(tmp_path, serve):
    flag = os.path.join(str(tmp_path), "crashed")
    s = serve(env_cfg={"crash_once": flag})
    _hello(s)
    p = _plan(tmp_path, "bug2-step-reset-dp2-to-4")
    t1, t2 = os.path.join(str(tmp_path), "1.trace.json"), os.path.join(str(tmp_path), "2.trace.json")
    s.send({"id": 1, "plan": p, "out": t1})
    a = s.read()
    assert (a["type"], a["id"]) == ("done", 1), a
    assert os.path.exists(flag)
    tr = _trace(t1)
    assert ts.validate_trace(tr) == []
    ref = tr["runs"][0]
    assert ref["status"] == "failed"
    crash = [e for e in ref["events"] if e["at"] == "error"]
    assert [(e["rank"], e["py_type"]) for e in crash] == [(1, "WorkerCrash")]
    assert "exited with status 9" in crash[0]["message"]
    s.send({"id": 2, "plan": p, "out": t2})
    a = s.read()
    assert (a["type"], a["id"]) == ("done", 2), a
    tr = _trace(t2)
    assert ts.validate_trace(tr) == []
    assert [r["status"] for r in tr["runs"]] == ["completed"] * 3
    # the pool of 4 plus the one worker that replaced rank 1
    assert len(s.worker_logs()) == 5, s.worker_logs()
    s.send({"cmd": "exit"})
    assert s.wait() == 0


NEEDS_PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the workers in /proc (Linux)")


@NEEDS_PROC
def test_exit_closes_the_workers(tmp_path, serve):
    s = serve(extra=["--prestart-dp", "2"])
    _hello(s)
    s.send("{")  # answered after the prestart: the workers exist now
    assert s.read()["type"] == "error"
    assert len(s.worker_logs()) == 2
    pids = s.wait_for_workers(2)
    s.send({"cmd": "exit"})
    assert s.wait() == 0
    assert [p for p in pids if _alive(p)] == [] and s.live_workers() == []
    assert len(s.stdout_lines) == 2  # hello, the error; nothing for exit


@NEEDS_PROC
def test_sigterm_kills_the_workers_and_exits(tmp_path, serve):
    s = serve(extra=["--prestart-dp", "3"])
    _hello(s)
    s.send("[]")
    a = s.read()
    assert a["type"] == "error" and "JSON object" in a["message"]
    pids = s.wait_for_workers(3)
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait() == 128 + signal.SIGTERM
    assert [p for p in pids if _alive(p)] == [] and s.live_workers() == []
    assert any("SIGTERM" in line for line in s.stderr_lines)


def test_prestart_and_device_offset(tmp_path, serve):
    s = serve(extra=["--prestart-dp", "2", "--device-offset", "1"], env_cfg={"gpus": 2})
    _hello(s)
    t = os.path.join(str(tmp_path), "t.json")
    s.send({"id": "x", "plan": _plan(tmp_path, "bug2-step-reset-dp2-to-4"), "out": t})
    a = s.read()
    assert a["type"] == "done", a
    tr = _trace(t)
    assert [(r["backend"], r["devices"]) for r in tr["runs"]] == [("nccl", [1, 0]), ("nccl", [1, 0]),
                                                                   ("gloo", [1, 0, 1, 0])]
    assert "--device-offset" in tr["tool"]["argv"]
    s.send({"cmd": "exit"})
    assert s.wait() == 0


@pytest.mark.parametrize("args,needle", [
    ([], "name a checkout"),
    (["--megatron", "not-a-dir-nor-rev"], "holds no megatron/core"),
    (["--megatron", "=x"], "expected DIR or REVISION=DIR"),
    (["--megatron-root", "/no/such/root"], "not a directory"),
    (["--backend", "mpi"], "invalid choice"),
    (["--plan", "p.json"], "unrecognized arguments"),
])
def test_bad_arguments_answer_a_failed_hello(tmp_path, serve, args, needle):
    s = serve(checkout=False, extra=args)
    h = s.read()
    assert h["type"] == "hello" and h["ok"] is False and needle in h["error"], h
    assert s.wait() == 2
    assert len(s.stdout_lines) == 1


def test_fused_adam_standin_needs_emulate_te(tmp_path):
    meg = os.path.join(str(tmp_path), "m")
    os.makedirs(os.path.join(meg, "megatron", "core"))
    r = subprocess.run([sys.executable, "-m", "replay", "serve", "--megatron", meg, "--fused-adam-standin"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60, input="")
    assert r.returncode == 2
    h = json.loads(r.stdout)
    assert h["ok"] is False and "--emulate-te" in h["error"]


def test_help_and_the_options_run_and_serve_share():
    r = subprocess.run([sys.executable, "-m", "replay", "-h"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "serve" in r.stdout
    r = subprocess.run([sys.executable, "-m", "replay", "serve", "-h"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0
    for opt in ("--megatron", "--megatron-root", "--backend", "--emulate-te", "--fused-adam-standin", "--values",
                "--work-dir", "--keep-checkpoints", "--collective-timeout", "--abort-grace", "--run-timeout",
                "--python", "--prestart-dp", "--device-offset"):
        assert opt in r.stdout

    from replay import cli

    sub = next(a for a in cli.build_parser()._actions if a.choices and "run" in a.choices)

    def opts(p):
        return {o: (a.default, a.type, a.choices) for a in p._actions for o in a.option_strings}

    run, srv = opts(sub.choices["run"]), opts(sub.choices["serve"])
    only_run = {"--plan", "--out", "--out-dir", "--resume-from", "--dry-run", "--check-grads", "--no-prestart"}
    assert set(run) - set(srv) == only_run
    assert set(srv) - set(run) == {"--prestart-dp", "--device-offset"}
    assert all(run[o] == srv[o] for o in set(run) & set(srv))
