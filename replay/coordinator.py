"""Runs the runs of replay plans on pools of worker processes and assembles the traces
(torch-free: the coordinator only starts, feeds and watches `python -m replay.worker`).

One pool of worker processes per Megatron checkout; worker i is rank i of every run it takes
part in, so a plan's phases at DP 2 then DP 4 use workers 0-1 and then 0-3 of the same pool.
Each run is a fresh process group (a new file:// store) and fresh Megatron objects: what a
restarted job sees, except that the Python process (and so its imports) is reused.

When a rank of a run fails, the others get `abort_grace_s` seconds to finish or fail on their
own; a rank still running after that is stopped (its worker process is killed and replaced)
and recorded as PeerAborted (secondary), as ckptsim's model records the ranks of a crashed job.
An error that another rank's failure plausibly caused (a communication error after the first
error) is marked secondary too. A job that died at a storage fault leaves no worker behind: the
ranks that outlived the crash are replaced as well (a restarted job's processes are new).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from . import checkouts as co
from . import checkpoint_layout as layout
from . import model_parallel
from . import errors as errors_mod
from . import plan as plan_mod
from . import storage_faults as sf_mod
from . import trace_schema as ts

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMM_ERROR_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError", "PeerAborted"}
COMM_ERROR_TEXT = re.compile(r"connection (closed|reset)|timed out|timeout|broken pipe|peer|nccl error|"
                             r"gloo|socket|ProcessGroup", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Decisions (pure functions, tested without a GPU)
# ---------------------------------------------------------------------------------------------
def te_decision(kind: str, needs_te: bool, te_installed: bool, emulate_te: bool, standin: bool
                ) -> Tuple[Optional[str], bool, Optional[str]]:
    """(te mode of the run, stand-in injected, reason to skip it). `needs_te`: the scenario's
    environment has TE (plan.needs_te). TE "installed" includes apex (Megatron takes the same
    branches with apex's FusedAdam)."""
    if not needs_te:
        if te_installed:
            return None, False, ("the scenario runs without TE (%s), and TE or apex is installed here, so "
                                 "Megatron would take its TE branches" %
                                 ("Megatron's torch AdamW fallback" if kind == "torch_adamw"
                                  else "optimizer.transformer_engine \"absent\""))
        return "absent", False, None
    if te_installed:
        return "real", False, None
    if kind == "fused_adam":
        if emulate_te and standin:
            return "emulated", True, None
        return None, False, ("fused_adam needs TE's FusedAdam, and TE is not installed here: pass --emulate-te "
                             "--fused-adam-standin to replay it on the labelled stand-in")
    if kind == "hybrid":
        if emulate_te:
            return "emulated", bool(standin), None
        return None, False, ("the scenario's hybrid optimizer has TE, and TE is not installed here: pass "
                             "--emulate-te (with --fused-adam-standin for its GPU part), or set "
                             "optimizer.transformer_engine \"absent\" to replay Megatron's no-TE branches")
    return None, False, "unknown optimizer kind %r" % kind


def backend_decision(requested: str, dp: int, gpus: int, offset: int = 0
                     ) -> Tuple[Optional[str], bool, List[int], Optional[str]]:
    """(backend, coalescing workaround, device of each rank, reason it cannot run).

    Rank r runs on device (offset + r) % gpus, for either backend: `offset` (`serve
    --device-offset`, 0 for `run`) spreads several runner processes over the GPUs of one host
    without changing the rank -> device order. With NCCL, dp <= gpus, so the ranks still get
    distinct devices (one GPU per rank); with gloo, ranks share devices round-robin."""
    if gpus < 1:
        return None, False, [], "no CUDA device is visible to the workers"
    if requested == "nccl" or (requested == "auto" and dp <= gpus):
        if dp > gpus:
            return None, False, [], "--backend nccl needs one GPU per rank: DP %d, %d GPUs" % (dp, gpus)
        return "nccl", False, [(offset + r) % gpus for r in range(dp)], None
    if requested in ("gloo", "auto"):
        return "gloo", True, [(offset + r) % gpus for r in range(dp)], None
    return None, False, [], "unknown backend %r" % requested


def looks_like_peer_failure(ev: Dict[str, Any]) -> bool:
    return ev.get("py_type") in COMM_ERROR_TYPES or bool(COMM_ERROR_TEXT.search(ev.get("message", "")))


def order_events(per_rank: Dict[int, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Merges the ranks' event lists: by (position in the rank's own list, rank)."""
    keyed = [((i, r), ev) for r, evs in per_rank.items() for i, ev in enumerate(evs)]
    keyed.sort(key=lambda kv: kv[0])
    return [ev for _, ev in keyed]


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------
class Worker:
    def __init__(self, python: str, checkout: str, index: int, log_dir: str, env: Dict[str, str]) -> None:
        self.checkout = checkout
        self.index = index
        label = os.path.basename(checkout.rstrip("/")) or "checkout"
        self.log_path = os.path.join(log_dir, "worker-%s-%d-%d.log" % (label, index, int(time.time() * 1000) % 100000))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([python, "-u", "-m", "replay.worker", "--megatron", checkout, "--index", str(index)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                    cwd=PACKAGE_PARENT, env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.state = "starting"  # starting -> idle -> busy -> cleaning -> idle; dead
        self.hello: Optional[Dict[str, Any]] = None
        self._buf = b""
        self.started = time.time()

    def send(self, obj: Dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def read_messages(self) -> Tuple[List[Dict[str, Any]], bool]:
        """Messages available now, and whether the pipe reached EOF."""
        eof = False
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self._buf += chunk
        msgs = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                msgs.append(json.loads(line.decode("utf-8")))
        return msgs, eof

    def death(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            return "running"
        if rc < 0:
            try:
                return "killed by signal %d (%s)" % (-rc, signal.Signals(-rc).name)
            except ValueError:
                return "killed by signal %d" % -rc
        return "exited with status %d" % rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.state = "dead"
        try:
            self._log.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.proc.poll() is None and self.state in ("idle", "starting"):
            try:
                self.send({"cmd": "exit"})
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired, BrokenPipeError):
                pass
        self.kill()


class Coordinator:
    def __init__(self, opts: Dict[str, Any]) -> None:
        self.opts = opts
        self.python = opts.get("python") or sys.executable
        self.work = opts["work_dir"]
        self.log_dir = os.path.join(self.work, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.pools: Dict[str, List[Worker]] = {}
        self.env = dict(os.environ)
        self.env.setdefault("NCCL_NVLS_ENABLE", "0")
        self.env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        self.env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        self.env["PYTHONUNBUFFERED"] = "1"
        # One intra-op thread per rank, as torchrun starts each rank of a Megatron job
        # (OMP_NUM_THREADS=1 unless the launch sets it): many ranks on one machine would otherwise
        # each start a thread per core. A value in the runner's environment wins.
        self.threads_note = None
        if "OMP_NUM_THREADS" not in self.env:
            self.env["OMP_NUM_THREADS"] = "1"
            self.threads_note = ("OMP_NUM_THREADS=1 in every rank, as torchrun sets it (the runner's "
                                 "environment did not set it)")
        self.env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self._pg_counter = 0
        self.last_hello: Optional[Dict[str, Any]] = None
        self.print = opts.get("print", lambda s: print(s, flush=True))

    # ------------------------------------------------------------------ pools
    def _pump(self, workers: List[Worker], timeout: float) -> List[Tuple[Worker, Optional[Dict[str, Any]]]]:
        """Waits up to `timeout` for messages of any of `workers`; (worker, None) means it died."""
        sel = selectors.DefaultSelector()
        live = [w for w in workers if w.state != "dead"]
        for w in live:
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        out: List[Tuple[Worker, Optional[Dict[str, Any]]]] = []
        try:
            ready = sel.select(timeout=max(0.0, timeout)) if live else []
        finally:
            sel.close()
        for key, _ in ready:
            w = key.data
            msgs, eof = w.read_messages()
            out.extend((w, m) for m in msgs)
            if eof:
                if w.proc.poll() is None:
                    try:
                        w.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.proc.kill()
                w.state = "dead"
                out.append((w, None))
        return out

    def _wait_state(self, w: Worker, timeout: float) -> None:
        """Drives a starting or cleaning worker to idle, or kills it after `timeout` seconds."""
        deadline = time.time() + timeout
        while w.state in ("starting", "cleaning") and time.time() < deadline:
            for ww, msg in self._pump([w], deadline - time.time()):
                if msg is None:
                    continue
                if msg.get("type") == "hello":
                    ww.hello = msg
                    self.last_hello = msg
                    ww.state = "idle" if msg.get("ok") else "broken"
                elif msg.get("type") == "ready":
                    ww.state = "idle"
        if w.state in ("starting", "cleaning"):
            self.print("worker %d (%s) not ready after %.0f s: killed; log %s" % (w.index, w.checkout, timeout, w.log_path))
            w.kill()

    def workers_for(self, checkout: str, n: int) -> List[Worker]:
        pool = self.pools.setdefault(checkout, [])
        for i in range(n):
            if i >= len(pool):
                pool.append(None)  # type: ignore[arg-type]
            w = pool[i]
            if w is None or w.state == "dead":
                pool[i] = Worker(self.python, checkout, i, self.log_dir, self.env)
        ws = pool[:n]
        for w in ws:
            if w.state in ("starting", "cleaning"):
                self._wait_state(w, float(self.opts.get("start_timeout_s", 300)))
            if w.state == "dead":  # died while starting or cleaning: one more try
                idx = pool.index(w)
                pool[idx] = Worker(self.python, checkout, w.index, self.log_dir, self.env)
                self._wait_state(pool[idx], float(self.opts.get("start_timeout_s", 300)))
        return pool[:n]

    def prestart(self, checkout: str, n: int) -> None:
        """Starts (without waiting) the first n workers of a checkout's pool, so that the imports of
        every pool overlap instead of running one after another."""
        pool = self.pools.setdefault(checkout, [])
        while len(pool) < n:
            pool.append(Worker(self.python, checkout, len(pool), self.log_dir, self.env))

    def probe(self, checkout: str) -> Optional[Dict[str, Any]]:
        """The hello of worker 0 of a checkout's pool (starts it): torch, GPUs, TE."""
        w = self.workers_for(checkout, 1)[0]
        return w.hello

    def close(self, kill: bool = False) -> None:
        """Ends every worker: idle and starting ones are asked to exit (up to 20 s each), the
        others killed; with `kill`, all are killed at once (SIGTERM of `serve`)."""
        for pool in self.pools.values():
            for w in pool:
                if w is not None:
                    if kill:
                        w.kill()
                    else:
                        w.close()

    def drop_busy_workers(self) -> int:
        """Kills the workers still marked busy (a run that an exception interrupted left them
        running its job), so that the next run gets fresh ones in their places; idle workers are
        kept. Returns how many were killed."""
        n = 0
        for pool in self.pools.values():
            for w in pool:
                if w is not None and w.state == "busy":
                    w.kill()
                    n += 1
        return n

    # ------------------------------------------------------------------ one run
    def execute_run(self, plan_path: str, plan: Dict[str, Any], index: int, checkout: Optional[str],
                    missing_reason: Optional[str], done: Dict[str, Dict[str, Any]], ckpt_root: str,
                    resume_from: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        run = plan["runs"][index]
        world = model_parallel.world_size(run)
        rec: Dict[str, Any] = {"id": run["id"], "dp": run["dp"], "revision": run["revision"],
                               "start_step": run["start_step"], "steps": run["steps"], "load": bool(run["load"]),
                               "save": bool(run["save"]), "events": []}
        if "phase" in run:
            rec["phase"] = run["phase"]
        rec.update({k: run[k] for k in ("tp", "pp") if k in run})

        def skipped(reason: str) -> Dict[str, Any]:
            rec["status"] = "skipped"
            rec["skipped_reason"] = reason
            return rec

        crash_mode = plan_mod.has_storage_faults(plan)
        src = plan_mod.load_source(plan, index)
        external = (resume_from or {}).get(run["id"]) if run["load"] else None
        if crash_mode and run["load"]:
            # One checkpoint root for every phase: the job after the previous phase resumes from
            # what the tracker names, or starts from random (crash_resume_source).
            prev = done.get(plan["runs"][index - 1]["id"])
            if prev is None or not resumes_after(prev):
                return skipped("%s did not complete, so there is no checkpoint to resume from"
                               % plan["runs"][index - 1]["id"])
            tracker = tracker_state(ckpt_root)
            rec["load"] = tracker is not None
            if tracker is None:
                rec.pop("load_from", None)
            else:
                rec["load_from"] = saved_by(done, tracker) or plan["runs"][index - 1]["id"]
        elif run["load"]:
            rec["load_from"] = src
            if external:
                # --resume-from: the given checkpoint, whatever became of the plan's source run.
                rec["resumed_from"] = external
            else:
                prev = done.get(src) if src else None
                if prev is None or prev["status"] != "completed":
                    return skipped("%s did not complete, so there is no checkpoint to resume from"
                                   % (src or "no earlier run"))
        if checkout is None:
            return skipped(missing_reason or "no Megatron checkout for revision %s" % run["revision"])
        reason = plan_mod.unsupported_reason(plan)
        if reason:
            return skipped(reason)
        hello = self.probe(checkout)
        if hello is None or not hello.get("ok"):
            # The checkout does not even import: a real outcome of that revision on this machine.
            rec["status"] = "failed"
            rec["events"] = [_import_error_event(r, hello) for r in range(world)]
            return rec
        kind = plan["scenario"]["optimizer"]["kind"]
        te_mode, standin, why = te_decision(kind, plan_mod.needs_te(plan),
                                            bool(hello.get("transformer_engine") or hello.get("apex")),
                                            bool(self.opts.get("emulate_te")), bool(self.opts.get("fused_adam_standin")))
        if why:
            return skipped(why)
        backend, workaround, devices, why = backend_decision(self.opts.get("backend", "auto"), world,
                                                             int(hello.get("gpus", 0)),
                                                             int(self.opts.get("device_offset", 0)))
        if why:
            return skipped(why)
        rec.update({"backend": backend, "te": te_mode, "fused_adam_standin": standin,
                    "coalescing_workaround": workaround, "devices": devices})
        self._pg_counter += 1
        pg_file = os.path.join(self.work, "pg", "store-%d-%d" % (os.getpid(), self._pg_counter))
        os.makedirs(os.path.dirname(pg_file), exist_ok=True)
        if os.path.exists(pg_file):
            os.remove(pg_file)
        if crash_mode and run["id"] != "reference":
            save_dir = ckpt_root if run["save"] else None
            load_dir = ckpt_root if run["load"] else None
        else:
            save_dir = os.path.join(ckpt_root, run["id"]) if run["save"] else None
            if save_dir and os.path.exists(save_dir):
                shutil.rmtree(save_dir)
            load_dir = external or (os.path.join(ckpt_root, src) if run["load"] else None)
        fault_files = {k: os.path.join(self.work, "pg", "%s-%d-%d" % (k, os.getpid(), self._pg_counter))
                       for k in ("crash_marker", "fault_record", "fault_counts")}
        faults = plan_mod.storage_faults(plan, run) if crash_mode else []
        workers = self.workers_for(checkout, world)
        broken = [w for w in workers if w.state != "idle"]
        if broken:
            rec["status"] = "failed"
            rec["events"] = [_import_error_event(r, workers[r].hello) if workers[r].state != "idle"
                             else errors_mod.peer_aborted_event(r, "init", "another rank's worker could not start")
                             for r in range(world)]
            return rec
        t0 = time.time()
        job_id = "%s#%d:%s" % (os.path.basename(plan_path), self._pg_counter, run["id"])
        for r, w in enumerate(workers):
            w.send({"cmd": "run", "job_id": job_id, "plan_path": os.path.abspath(plan_path), "run_index": index,
                    "rank": r, "device": devices[r], "backend": backend, "init_method": "file://" + pg_file,
                    "collective_timeout_s": float(self.opts.get("collective_timeout_s", 120)),
                    "te": te_mode, "standin": standin, "coalescing_workaround": workaround,
                    "save_dir": save_dir, "load_dir": load_dir, "values": bool(self.opts.get("values")),
                    "crash_mode": crash_mode, "storage_faults": faults, **fault_files})
            w.state = "busy"
        results = self._collect(workers, run, time.time() + float(self.opts.get("run_timeout_s", 900)),
                                fault_files["crash_marker"])
        rec["wall_s"] = round(time.time() - t0, 2)
        per_rank: Dict[int, List[Dict[str, Any]]] = {}
        notes: List[str] = []
        first_error_at: Optional[float] = None
        for r in range(world):
            res = results[r]
            per_rank[r] = res.get("events", [])
            notes.extend(res.get("notes", []))
            if res.get("_error_at") is not None:
                first_error_at = res["_error_at"] if first_error_at is None else min(first_error_at, res["_error_at"])
        # Errors that another rank's failure plausibly caused are secondary.
        for r in range(world):
            res = results[r]
            if first_error_at is None or res.get("_error_at") is None or res["_error_at"] <= first_error_at:
                continue
            for ev in per_rank[r]:
                if ev["at"] == "error" and looks_like_peer_failure(ev):
                    ev["secondary"] = True
        if crash_mode:
            self._crash_record(rec, run, results, per_rank, fault_files)
            if rec.get("crashed"):
                self._end_crashed_job(workers)
        rec["events"] = order_events(per_rank)
        rec["status"] = "failed" if any(ev["at"] == "error" for ev in rec["events"]) else "completed"
        if crash_mode and run["id"] != "reference":
            rec["_save_iteration"] = save_iteration(rec, run)
        rec["_notes"] = sorted(set(notes))
        rec["_timings"] = {r: results[r].get("timings", {}) for r in range(world)}
        return rec

    def _end_crashed_job(self, workers: List[Worker]) -> None:
        """A job that died at a storage fault leaves none of its processes behind (a scheduler
        stops them all): a rank that outlived the crash (one that failed on its own after it, or
        finished) is replaced as well, so that nothing of the dead job (an async writer's queue,
        a save half done) reaches the next run, as it could not reach a restarted job."""
        for w in workers:
            if w.state != "dead":
                self.print("worker %d (%s) outlived the crashed job: replaced"
                           % (w.index, os.path.basename(w.checkout.rstrip("/"))))
                w.kill()

    def _crash_record(self, rec: Dict[str, Any], run: Dict[str, Any], results: Dict[int, Dict[str, Any]],
                      per_rank: Dict[int, List[Dict[str, Any]]], files: Dict[str, str]) -> None:
        """A run of a plan with storage faults: the faults that fired, whether the job died, where
        it started (the ranks' own account: a fresh start, or the iteration loaded), and the
        ranks that the crash (not an error of theirs) stopped."""
        fired = sf_mod.read_lines(files["fault_record"])
        crashed = os.path.exists(files["crash_marker"])
        if fired:
            rec["storage_faults"] = fired
        if crashed:
            rec["crashed"] = True
            killer = crash_rank(fired)
            for r, evs in per_rank.items():
                if evs and evs[-1]["at"] == "error" and evs[-1]["py_type"] in ("WorkerCrash", "PeerAborted",
                                                                                  "ReplayTimeout"):
                    evs[-1].update({"py_type": "JobCrashed", "secondary": r != killer, "site": "",
                                    "message": "the job died at a storage fault (%s)" % "; ".join(fired)})
        fresh = [bool(res.get("started_fresh")) for res in results.values() if "started_fresh" in res]
        if run["load"] and fresh and all(fresh):
            rec["load"] = False
            rec.pop("load_from", None)
            rec["start_step"] = 0
        elif run["load"]:
            loaded = [ev["global_step"] for evs in per_rank.values() for ev in evs if ev["at"] == "after_load"]
            rec["start_step"] = loaded[0] if loaded else 0
        for k in files.values():
            for path in [k] + [k + ".rank%d" % r for r in range(len(per_rank))]:
                if os.path.exists(path):
                    os.remove(path)

    def _collect(self, workers: List[Worker], run: Dict[str, Any], deadline: float,
                 crash_marker: Optional[str] = None) -> Dict[int, Dict[str, Any]]:
        results: Dict[int, Dict[str, Any]] = {}
        streamed: Dict[int, List[Dict[str, Any]]] = {r: [] for r in range(len(workers))}
        stage_of: Dict[int, str] = {r: "init" for r in range(len(workers))}
        rank_of = {id(w): r for r, w in enumerate(workers)}
        grace = float(self.opts.get("abort_grace_s", 15))
        first_error: Optional[float] = None
        while len(results) < len(workers):
            now = time.time()
            limit = deadline if first_error is None else min(deadline, first_error + grace)
            if now >= limit:
                why = ("the run exceeded its time limit (%.0f s)" % float(self.opts.get("run_timeout_s", 900))
                       if first_error is None else "stopped after another rank failed")
                for r, w in enumerate(workers):
                    if r not in results:
                        self.print("rank %d (worker %d) %s: killed; log %s" % (r, w.index, why, w.log_path))
                        w.kill()
                        ev = errors_mod.peer_aborted_event(r, stage_of[r], why)
                        if first_error is None:
                            ev.update({"py_type": "ReplayTimeout", "secondary": False})
                        results[r] = {"events": streamed[r] + [ev], "_error_at": now}
                break
            for w, msg in self._pump([w for r, w in enumerate(workers) if r not in results or w.state == "cleaning"],
                                     limit - now):
                r = rank_of[id(w)]
                if msg is not None and msg.get("type") == "ready":
                    w.state = "idle"
                    continue
                if r in results:
                    continue
                if msg is not None and msg.get("type") == "event":
                    streamed[r].append(msg["event"])
                    continue
                if msg is not None and msg.get("type") == "stage":
                    stage_of[r] = msg["stage"]
                    continue
                if msg is None and crash_marker and os.path.exists(crash_marker) and first_error is None:
                    # The job died at a storage fault: a scheduler stops every rank at once.
                    first_error = time.time() - grace
                if msg is None:
                    ev = {"rank": r, "at": "error", "stage": stage_of[r], "py_type": "WorkerCrash",
                          "message": "the worker process %s (log %s)" % (w.death(), w.log_path), "site": "",
                          "site_line": None, "merge_path": None, "merge_kind": None, "secondary": False,
                          "global_step": None}
                    results[r] = {"events": streamed[r] + [ev], "_error_at": time.time()}
                elif msg.get("type") == "result":
                    w.state = "cleaning"
                    if msg.get("fatal"):
                        ev = {"rank": r, "at": "error", "stage": "init", "py_type": "ReplayRunnerError",
                              "message": msg["fatal"], "site": "", "site_line": None, "merge_path": None,
                              "merge_kind": None, "secondary": False, "global_step": None,
                              "traceback": msg.get("traceback", "")}
                        msg = dict(msg, events=[ev])
                    if any(ev["at"] == "error" for ev in msg.get("events", [])):
                        msg["_error_at"] = time.time()
                    results[r] = msg
                else:
                    continue
                if results.get(r, {}).get("_error_at") is not None and first_error is None:
                    first_error = results[r]["_error_at"]
        return results

    # ------------------------------------------------------------------ one plan
    def replay_plan(self, plan_path: str, plan: Dict[str, Any], mapping: Dict[str, str],
                    missing: Dict[str, str], resume_from: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        name = plan_mod.scenario_name(plan)
        os.makedirs(os.path.join(self.work, "checkpoints"), exist_ok=True)
        ckpt_root = tempfile.mkdtemp(prefix="ckpt-%s-" % re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40],
                                     dir=os.path.join(self.work, "checkpoints"))
        done: Dict[str, Dict[str, Any]] = {}
        runs = []
        for i, run in enumerate(plan["runs"]):
            rev = run["revision"]
            rec = self.execute_run(plan_path, plan, i, mapping.get(rev), missing.get(rev), done, ckpt_root,
                                   resume_from)
            done[run["id"]] = rec
            runs.append(rec)
            sizes = "".join(" %s=%d" % (k, rec[k]) for k in ("tp", "pp") if k in rec)
            line = "  %-10s dp=%d%s %-18s %-9s" % (rec["id"], rec["dp"], sizes, rev, rec["status"])
            if rec.get("backend"):
                line += " backend=%s te=%s" % (rec["backend"], rec["te"])
            if rec.get("wall_s") is not None:
                line += " %.1fs" % rec["wall_s"]
            if rec.get("skipped_reason"):
                line += " (%s)" % rec["skipped_reason"]
            if rec.get("resumed_from"):
                line += " resumed from %s" % rec["resumed_from"]
            first = next((e for e in rec["events"] if e["at"] == "error" and not e.get("secondary")), None)
            if first:
                line += "\n      rank %d %s: %s: %s [%s]" % (first["rank"], first["stage"], first["py_type"],
                                                           first["message"][:400].replace("\n", " "),
                                                           first.get("site_line") or first.get("site"))
            self.print(line)
        if not self.opts.get("keep_checkpoints"):
            shutil.rmtree(ckpt_root, ignore_errors=True)
        return self._trace(plan_path, plan, mapping, runs)

    def _trace(self, plan_path: str, plan: Dict[str, Any], mapping: Dict[str, str], runs: List[Dict[str, Any]]
               ) -> Dict[str, Any]:
        ran = [r for r in runs if r["status"] != "skipped" and r.get("backend")]
        backends = sorted({r["backend"] for r in ran})
        tes = sorted({r["te"] for r in ran})
        hello = self.last_hello or {}
        notes: List[str] = []
        for r in runs:
            notes.extend(r.pop("_notes", []))
            r.pop("_timings", None)
            r.pop("_save_iteration", None)
        if self.threads_note and ran:
            notes.append(self.threads_note)
        te_env = "real" if (hello.get("transformer_engine") or hello.get("apex")) else "absent"
        setup = {
            "backend": backends[0] if len(backends) == 1 else ("mixed" if backends else ("nccl" if hello.get("gpus", 0) else "gloo")),
            "gpus": int(hello.get("gpus", 0) or 0),
            "coalescing_workaround": any(r.get("coalescing_workaround") for r in ran),
            "te": tes[0] if len(tes) == 1 else ("mixed" if tes else te_env),
            "fused_adam_standin": bool(self.opts.get("fused_adam_standin")),
            "torch": hello.get("torch"),
            "python": hello.get("python"),
            "hash": ts.HASH_NAME,
            "adaptations": sorted(set(notes)),
            "collective_timeout_s": float(self.opts.get("collective_timeout_s", 120)),
            "values": bool(self.opts.get("values")),
            "device_names": hello.get("device_names", []),
            "transformer_engine": bool(hello.get("transformer_engine")),
            "apex": bool(hello.get("apex")),
        }
        megatron: Dict[str, Any] = {}
        for rev, info in plan["revisions"].items():
            d = mapping.get(rev)
            megatron[rev] = co.describe(d, info.get("upstream")) if d else None
        gen = plan.get("generator") or {}
        return {"format": ts.FORMAT, "version": ts.VERSION, "source": "real", "megatron": megatron, "setup": setup,
                "scenario": plan_mod.scenario_name(plan), "runs": runs,
                "tool": {"name": "replay", "argv": self.opts.get("argv", [])},
                "plan": {"path": os.path.abspath(plan_path), "synthetic": bool(gen.get("synthetic", False)),
                         "generator": gen.get("tool")}}


def resumes_after(prev: Dict[str, Any]) -> bool:
    """sim/driver.cpp resumes_after(): the job after `prev` runs where `prev` completed and saved,
    or its save met a storage fault (every primary error of it in the save, or the job died)."""
    if prev["status"] == "completed":
        return bool(prev.get("save"))
    if prev["status"] == "skipped" or not prev.get("storage_faults"):
        return False
    return all(ev.get("secondary") or ev.get("stage") == "save"
               for ev in prev["events"] if ev["at"] == "error")


def tracker_state(root: str) -> Optional[int]:
    """The iteration the tracker in `root` names (-1: a tracker that names none), None: none."""
    path = os.path.join(root, layout.TRACKER)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return -1


def saved_by(done: Dict[str, Dict[str, Any]], iteration: int) -> Optional[str]:
    """The last run whose save wrote `iteration` (model: PhaseRecord::loaded_phase)."""
    found = None
    for rid, rec in done.items():
        if rec.get("_save_iteration") == iteration:
            found = rid
    return found


def save_iteration(rec: Dict[str, Any], run: Dict[str, Any]) -> Optional[int]:
    """The iteration the run's save wrote (or began to): its start plus its steps, where it saved,
    or its save met a storage fault, and no rank failed before the save."""
    if not run.get("save") or rec["status"] == "skipped":
        return None
    early = [ev for ev in rec["events"] if ev["at"] == "error" and not ev.get("secondary") and ev["stage"] != "save"]
    if early or (rec["status"] != "completed" and not rec.get("storage_faults")):
        return None
    return int(rec.get("start_step", 0)) + int(run["steps"])


def crash_rank(fired: List[str]) -> Optional[int]:
    """The rank whose write a crash fired at ("... (rank R)"), or None."""
    for line in fired:
        m = re.search(r"\(rank (\d+)\)$", line)
        if m and line.split(" ", 1)[0] in sf_mod.CRASH_KINDS:
            return int(m.group(1))
    return None


def _import_error_event(rank: int, hello: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    err = (hello or {}).get("error") or "the worker did not start"
    py_type, _, message = err.partition(": ")
    site, site_line = "", None
    tb = (hello or {}).get("traceback", "")
    for m in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', tb):
        rel = errors_mod._package_relative(m.group(1))
        if rel:
            site, site_line = "%s %s()" % (os.path.basename(rel), m.group(3)), "%s:%s" % (rel, m.group(2))
    return {"rank": rank, "at": "error", "stage": "init", "py_type": py_type or "ImportError", "message": message or err,
            "site": site, "site_line": site_line, "merge_path": None, "merge_kind": None, "secondary": rank != 0,
            "global_step": None, "traceback": tb}
