"""`python -m replay serve`: a long-running replay runner that replays one plan per request
(torch-free; only the worker processes it starts import torch and megatron).

ckptsim starts N of these and hands each one plan at a time. One Coordinator serves every
request of the process, so its worker pools (one per checkout, the imports of megatron.core
already paid) stay warm from one plan to the next; a worker that dies is replaced by the pool
at the next run that needs it, as in `run`.

The protocol (replay/PLAN_AND_TRACE.md, "The serve protocol"): stdout carries only protocol
lines, one JSON object per line, each flushed as written; everything else the process (or a
child that inherits its stdout) prints goes to stderr.

  -> {"type": "hello", "ok": true, "pid": P, "work_dir": W}        first, once
     {"type": "hello", "ok": false, "error": M}                     bad arguments; exit 2
  <- {"id": ID, "plan": PLAN_PATH, "out": TRACE_PATH}               one per line
  -> {"type": "done", "id": ID, "trace": TRACE_PATH, "seconds": S, "schema_problems": [...]}
     {"type": "error", "id": ID or null, "message": M, "traceback"?: T}
  <- {"cmd": "exit"}, or the end of stdin                           close the workers, exit 0
  SIGTERM                                                           kill the workers, exit 143

Every request line gets exactly one answer, in the order the requests came (blank lines are
skipped). The trace is written to TRACE_PATH + ".tmp" and renamed, so TRACE_PATH is either
absent or a whole trace. Relative paths are taken from the server's working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from . import checkouts as co
from . import cli
from . import plan as plan_mod
from . import trace_schema as ts

EXIT_ON_SIGTERM = 128 + signal.SIGTERM
MAX_SCHEMA_PROBLEMS = 20


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler; a BaseException, so that the handler
    of unexpected errors in one request does not swallow it."""


def emit(out: TextIO, obj: Dict[str, Any]) -> None:
    """Writes one protocol line and flushes it (a reader waits on each line)."""
    out.write(json.dumps(obj) + "\n")
    out.flush()


class _HelloOnErrorParser(argparse.ArgumentParser):
    """argparse that answers a bad argument on stdout too, as `{"type": "hello", "ok": false}`,
    so that the process that started the server reads why it ends (the usage goes to stderr)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        try:
            emit(sys.stdout, {"type": "hello", "ok": False, "error": message})
        except OSError:
            pass
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _HelloOnErrorParser(prog="python -m replay serve",
                            description="Replay one plan per request read from stdin (JSON lines); answers on stdout.")
    cli.add_serve_arguments(p)
    return p


def check_args(a: argparse.Namespace) -> Tuple[Optional[str], List[str]]:
    """(what is wrong with the arguments or None, the checkout dirs that --megatron names, absolute
    and without repeats). Checks what `run` checks before it replays anything, except the plans:
    every named folder is a checkout and --megatron-root a folder."""
    if a.fused_adam_standin and not a.emulate_te:
        return cli.FUSED_ADAM_STANDIN_NEEDS_EMULATE_TE, []
    if a.prestart_dp < 0:
        return "--prestart-dp %d: must be 0 or more" % a.prestart_dp, []
    if a.device_offset < 0:
        return "--device-offset %d: must be 0 or more" % a.device_offset, []
    try:
        default, per_rev = co.parse_megatron_args(a.megatron)
        if not default and not per_rev and not a.megatron_root:
            raise co.CheckoutError(cli.NAME_A_CHECKOUT)
        co.resolve({}, default, per_rev, a.megatron_root)  # raises for a named folder that is not a checkout
    except co.CheckoutError as e:
        return str(e), []
    named: List[str] = []
    for d in ([default] if default else []) + sorted(per_rev.values()):
        d = os.path.abspath(d)  # the pool key co.resolve gives the runs
        if d not in named:
            named.append(d)
    return None, named


class Server:
    """Answers the requests of one `serve` process. Invariants: every request line gets exactly
    one answer on `replies`, in order; `coord` lives as long as the server, so its pools serve
    every request; after a request that an unexpected exception interrupted, the workers it left
    busy are killed (and replaced at the next run), the idle ones are kept."""

    def __init__(self, a: argparse.Namespace, argv: Sequence[str], replies: TextIO, log: TextIO) -> None:
        self.a = a
        self.argv = list(argv)
        self.replies = replies
        self.log = log
        self.default, self.per_rev = co.parse_megatron_args(a.megatron)
        self.coord: Any = None

    def say(self, s: str) -> None:
        self.log.write(s + "\n")
        self.log.flush()

    def start(self, work: str) -> None:
        from .coordinator import Coordinator

        opts = cli.coordinator_opts(self.a, work, self.argv)
        opts["device_offset"] = int(self.a.device_offset)
        opts["print"] = self.say
        self.coord = Coordinator(opts)

    # ------------------------------------------------------------------ requests
    def handle_line(self, line: str) -> bool:
        """Answers one request line; False when the server is to exit (no answer then)."""
        try:
            req = json.loads(line)
        except ValueError as e:
            emit(self.replies, {"type": "error", "id": None, "message": "not a JSON line: %s" % e})
            return True
        if not isinstance(req, dict):
            emit(self.replies, {"type": "error", "id": None, "message": "a request is a JSON object, not %s"
                                % type(req).__name__})
            return True
        rid = req.get("id")
        if "cmd" in req:
            if req["cmd"] == "exit":
                return False
            emit(self.replies, {"type": "error", "id": rid, "message": "unknown cmd %r (the only one is \"exit\")"
                                % (req["cmd"],)})
            return True
        lacking = [k for k in ("id", "plan", "out") if k not in req]
        bad = [k for k in ("plan", "out") if k in req and not (isinstance(req[k], str) and req[k])]
        if lacking or bad:
            emit(self.replies, {"type": "error", "id": rid, "message": "a request is {\"id\", \"plan\", \"out\"}: %s"
                                % "; ".join((["lacks " + ", ".join(lacking)] if lacking else [])
                                            + (["%s is not a path" % ", ".join(bad)] if bad else []))})
            return True
        try:
            answer = self.replay(rid, req["plan"], req["out"])
        except Exception as e:  # noqa: BLE001 - a bug here must not end the server
            tb = traceback.format_exc()
            self.say("request %s: unexpected %s" % (json.dumps(rid), tb))
            killed = self.coord.drop_busy_workers()
            if killed:
                self.say("request %s: killed %d busy workers (replaced at the next run)" % (json.dumps(rid), killed))
            answer = {"type": "error", "id": rid, "message": "%s: %s" % (type(e).__name__, e), "traceback": tb}
        emit(self.replies, answer)
        return True

    def replay(self, rid: Any, plan_path: str, out: str) -> Dict[str, Any]:
        """The answer to one well-formed request (raises only on a bug or an unwritable TRACE_PATH)."""
        t0 = time.time()
        try:
            plan = plan_mod.load_plan(plan_path)
            found, missing = co.resolve(plan["revisions"], self.default, self.per_rev, self.a.megatron_root)
        except (plan_mod.PlanError, co.CheckoutError) as e:
            return {"type": "error", "id": rid, "message": str(e)}
        self.say("request %s: replaying %s (%s)" % (json.dumps(rid), plan_mod.scenario_name(plan), plan_path))
        for rev in plan["revisions"]:
            self.say("  %-18s %s" % (rev, found.get(rev) or "NOT REPLAYED: " + missing.get(rev, "?")))
        trace = self.coord.replay_plan(plan_path, plan, found, missing, None)
        probs = ts.validate_trace(trace)
        if probs:
            self.say("internal error: the trace of %s breaks the schema:\n  %s"
                     % (plan_path, "\n  ".join(probs[:MAX_SCHEMA_PROBLEMS])))
        if os.path.dirname(out):
            os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(trace, f, indent=1)
                f.write("\n")
            os.replace(tmp, out)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        seconds = round(time.time() - t0, 3)
        self.say("request %s: -> %s (%.1f s)" % (json.dumps(rid), out, seconds))
        return {"type": "done", "id": rid, "trace": out, "seconds": seconds,
                "schema_problems": probs[:MAX_SCHEMA_PROBLEMS]}


def serve(a: argparse.Namespace, argv: Sequence[str], requests: TextIO, replies: TextIO, log: TextIO) -> int:
    """The server loop over `requests`; returns the exit status (0 exit or EOF, 2 bad arguments,
    143 SIGTERM). SIGTERM is handled only when this runs in the main thread."""
    why, named = check_args(a)
    work = ""
    if why is None:
        try:
            work = os.path.abspath(a.work_dir or tempfile.mkdtemp(prefix="ckptsim-replay-serve-"))
            os.makedirs(os.path.join(work, "logs"), exist_ok=True)
        except OSError as e:
            why = "--work-dir %s: %s" % (a.work_dir, e)
    if why is not None:
        emit(replies, {"type": "hello", "ok": False, "error": why})
        log.write("%s\n" % why)
        return 2
    server = Server(a, argv, replies, log)
    server.start(work)
    terminated: List[bool] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        if not terminated:  # a second SIGTERM while the workers are being killed is ignored
            terminated.append(True)
            raise _Terminated()

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    rc = 0
    try:
        emit(replies, {"type": "hello", "ok": True, "pid": os.getpid(), "work_dir": work})
        server.say("serving: work dir %s (worker logs in %s/logs)" % (work, work))
        if a.prestart_dp:
            for d in named:
                server.coord.prestart(d, a.prestart_dp)
        while True:
            line = requests.readline()
            if not line:
                break  # EOF
            if not line.strip():
                continue
            if not server.handle_line(line):
                break
    except _Terminated:
        rc = EXIT_ON_SIGTERM
        server.say("SIGTERM: killing the workers")
    except BrokenPipeError:
        rc = 1  # nobody reads the answers any more
        server.say("stdout closed: exiting")
    finally:
        try:
            server.coord.close(kill=bool(terminated))
        except _Terminated:  # SIGTERM during a graceful close: kill the rest
            rc = EXIT_ON_SIGTERM
            server.coord.close(kill=True)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return rc


def _protocol_stdout() -> TextIO:
    """Moves the process's stdout aside for the protocol: a private duplicate of fd 1 carries the
    answers, and fd 1 (with sys.stdout) becomes stderr, so that nothing else the process or its
    children print can reach the protocol stream."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


def cmd_serve(a: argparse.Namespace, argv: Sequence[str]) -> int:
    replies = _protocol_stdout()
    try:
        return serve(a, argv, sys.stdin, replies, sys.stderr)
    finally:
        try:
            replies.close()
        except OSError:
            pass


def main(args: Sequence[str]) -> int:
    """`python -m replay serve ARGS` (cli.main dispatches here)."""
    a = build_parser().parse_args(list(args))
    return cmd_serve(a, ["serve"] + list(args))
