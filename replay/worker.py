"""A replay worker process: one rank's process of a (restarted) Megatron job, reused for many
runs of many plans so that torch and megatron.core are imported once (8-13 s) and the first
save's warm-up (8-9 s) is paid once per process.

    python -m replay.worker --megatron CHECKOUT --index I

Started by replay.coordinator, never by hand. Protocol: one JSON object per line. The worker
writes to the file descriptor that was its stdout when it started ("hello" once, then "result"
and "ready" per job); everything else the process prints (Megatron's logging, warnings, C-level
output) goes to stderr, which the coordinator sends to a log file. It reads jobs from stdin:
{"cmd": "run", ...} (see RankRun) or {"cmd": "exit"}. Each run is a fresh process group
(init_process_group with the job's file:// store) and fresh Megatron objects, torn down after
the result is sent ("ready" follows once the teardown is done).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import sys
import time
import traceback
from typing import Any, Dict, TextIO


def _send(out: TextIO, obj: Dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replay.worker")
    ap.add_argument("--megatron", required=True, help="checkout that holds megatron/core")
    ap.add_argument("--index", type=int, required=True)
    a = ap.parse_args(argv)

    # The protocol gets the original stdout; fd 1 becomes stderr for everything else.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    checkout = os.path.abspath(a.megatron)
    sys.path.insert(0, checkout)

    hello: Dict[str, Any] = {"type": "hello", "index": a.index, "checkout": checkout, "pid": os.getpid(),
                             "python": platform.python_version()}
    try:
        t = time.time()
        import torch

        hello["import_torch_s"] = round(time.time() - t, 2)
        hello["torch"] = torch.__version__
        hello["cuda_available"] = torch.cuda.is_available()
        hello["gpus"] = torch.cuda.device_count()
        hello["device_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        t = time.time()
        import megatron.core  # noqa: F401
        import megatron.core.dist_checkpointing  # noqa: F401
        import megatron.core.distributed  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.optimizer_param_scheduler  # noqa: F401

        hello["import_megatron_s"] = round(time.time() - t, 2)
        hello["megatron_file"] = getattr(megatron.core, "__file__", None)
        hello["megatron_version"] = getattr(megatron.core, "__version__", None)
        from . import emulation

        hello["transformer_engine"] = emulation.te_installed()
        hello["apex"] = emulation.apex_installed()
        import megatron.core.optimizer.distrib_optimizer as dmod

        hello["HAVE_APEX_OR_TE"] = bool(getattr(dmod, "HAVE_APEX_OR_TE", False))
        emulation.STEP_RECORDER.install()
        hello["step_recorder"] = emulation.STEP_RECORDER.installed
        hello["ok"] = True
    except BaseException as e:  # noqa: BLE001
        hello["ok"] = False
        hello["error"] = "%s: %s" % (type(e).__name__, e)
        hello["traceback"] = traceback.format_exc()[-4000:]
        _send(proto, hello)
        return 1
    _send(proto, hello)

    from .megatron_run import RankRun

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        if job.get("cmd") == "exit":
            break
        if job.get("cmd") != "run":
            _send(proto, {"type": "result", "job_id": job.get("job_id"), "fatal": "unknown command %r" % job.get("cmd")})
            continue
        print("=== job %s: plan %s run %s rank %s" % (job.get("job_id"), job.get("plan_path"), job.get("run_index"),
                                                      job.get("rank")), file=sys.stderr, flush=True)
        rr = None
        try:
            rr = RankRun(job, sys.stderr)
            jid = job.get("job_id")
            rr.on_event = lambda ev, jid=jid: _send(proto, {"type": "event", "job_id": jid, "event": ev})
            rr.on_stage = lambda st, jid=jid: _send(proto, {"type": "stage", "job_id": jid, "stage": st})
            res = rr.execute()
            res.update({"type": "result", "job_id": job.get("job_id")})
        except BaseException as e:  # noqa: BLE001 - a bug of the runner itself, not a Megatron outcome
            res = {"type": "result", "job_id": job.get("job_id"),
                   "fatal": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()[-4000:]}
        _send(proto, res)
        if rr is not None:
            rr.cleanup()
        _send(proto, {"type": "ready", "job_id": job.get("job_id")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
