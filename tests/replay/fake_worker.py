"""A stand-in for `python -m replay.worker` in tests of the coordinator: it speaks the worker
protocol without torch or Megatron and makes up the optimizer state. Started through
fake_python (given to the coordinator as its interpreter); it ignores "-u -m replay.worker".

Behaviour is set by the environment variable FAKE_REPLAY (JSON):
  {"fail":  {RUN_ID: {"rank": R, "stage": S, "py_type": T, "message": M, "merge_path": [...]}},
   "hang":  {RUN_ID: [RANK, ...]},            ranks that never answer
   "crash": {RUN_ID: [RANK, ...]},            ranks whose process exits without a result
   "crash_once": PATH,                        the first run (of any plan, any worker) to reach it
                                              crashes: at the first stage of a run, rank 1 (rank
                                              0 where dp is 1) creates PATH and exits with status
                                              9 if PATH does not exist yet; once it exists, every
                                              worker behaves normally (PATH is created with
                                              O_EXCL, so of racing workers only one crashes)
   "storage_crash": {RUN_ID: RANK},          at its save, RANK waits "crash_delay" seconds (default
                                              1: the other ranks finish as usual first), creates
                                              the job's crash marker and exits with status 9 (a job
                                              that dies at a storage fault)
   "hello_fail": "ModuleNotFoundError: No module named 'miles_megatron_plugins'",
   "gpus": N, "te": bool}
Started with `-c SCRIPT` (ckptsim's real_preflight asks the workers' Python for torch and a GPU),
it prints {"torch": "fake", "gpus": N} instead.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from replay import plan as plan_mod  # noqa: E402
from replay import trace_schema as ts  # noqa: E402


def preflight(cfg):
    """`-c SCRIPT`, as ckptsim's real_preflight runs the workers' Python: what a Python with torch
    would answer (torch "fake", gpus as FAKE_REPLAY says, default 1)."""
    print(json.dumps({"torch": "fake", "gpus": cfg.get("gpus", 1)}))
    return 0


def main():
    if sys.argv[1:2] == ["-c"]:
        return preflight(json.loads(os.environ.get("FAKE_REPLAY", "{}")))
    args = [a for a in sys.argv[1:] if a not in ("-u", "-m", "replay.worker")]
    index = int(args[args.index("--index") + 1])
    checkout = args[args.index("--megatron") + 1]
    cfg = json.loads(os.environ.get("FAKE_REPLAY", "{}"))
    out = sys.stdout
    hello = {"type": "hello", "index": index, "checkout": checkout, "ok": True, "torch": "fake",
             "python": "3", "gpus": cfg.get("gpus", 1), "transformer_engine": cfg.get("te", False), "apex": False}
    if cfg.get("hello_fail"):
        hello.update(ok=False, error=cfg["hello_fail"],
                     traceback='File "%s/megatron/core/models/gpt/gpt_model.py", line 42, in <module>\n' % checkout)
        out.write(json.dumps(hello) + "\n")
        out.flush()
        return 1
    out.write(json.dumps(hello) + "\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("cmd") == "exit":
            return 0
        with open(job["plan_path"]) as f:
            plan = json.load(f)
        run = plan["runs"][job["run_index"]]
        rank = job["rank"]
        rid = run["id"]
        events = []
        gs = run["start_step"]
        fail = cfg.get("fail", {}).get(rid)
        names = [p["name"] for p in plan_mod.params(plan)]

        def ev(at, step_value):
            parts = [{"part": "HDO cpu AdamW", "param": n, "range": [0, 8], "step": step_value,
                      "step_used": step_value if at == "after_step" else None} for n in names]
            h = ts.hash_f32([float(gs)] * 8)
            return {"rank": rank, "at": at, "global_step": gs, "parts": parts,
                    "hashes": {"master": {n: h for n in names}, "exp_avg": {n: h for n in names},
                               "exp_avg_sq": {n: h for n in names}, "model_param": {n: h for n in names}}}

        def stream(e):
            out.write(json.dumps({"type": "event", "job_id": job["job_id"], "event": e}) + "\n")
            out.flush()

        def stage_msg(st):
            out.write(json.dumps({"type": "stage", "job_id": job["job_id"], "stage": st}) + "\n")
            out.flush()

        status = "completed"
        stages = (["load"] if run["load"] else []) + ["train"] + (["save"] if run["save"] else [])
        if not run["load"]:
            events.append(ev("init", None))
            stream(events[-1])
        counter = 1.0 if run["load"] else 0.0
        crash_rank = 1 if run["dp"] > 1 else 0
        for stage in stages:
            stage_msg(stage)
            if stage == stages[0] and rank == crash_rank and cfg.get("crash_once"):
                try:
                    os.close(os.open(cfg["crash_once"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os._exit(9)
            if stage == stages[-1] and rank in cfg.get("hang", {}).get(rid, []):
                time.sleep(3600)
            if stage == stages[-1] and rank in cfg.get("crash", {}).get(rid, []):
                os._exit(7)
            if stage == "save" and cfg.get("storage_crash", {}).get(rid) == rank and job.get("crash_marker"):
                # The other ranks finish their save first (they have nothing to wait for), so the
                # job's survivors are deterministic: what the coordinator must replace.
                time.sleep(float(cfg.get("crash_delay", 1.0)))
                with open(job["fault_record"], "a") as f:
                    f.write("crash_after at write 0 of shard files: __%d_0.distcp (rank %d)\n" % (rank, rank))
                with open(job["crash_marker"], "w") as f:
                    f.write("fake storage fault\n")
                os._exit(9)
            if fail and fail.get("rank", rank) == rank and fail["stage"] == stage:
                events.append({"rank": rank, "at": "error", "stage": stage, "py_type": fail["py_type"],
                               "message": fail["message"], "site": fail.get("site", "dict_utils.py merge()"),
                               "site_line": None, "merge_path": fail.get("merge_path"),
                               "merge_kind": fail.get("merge_kind"), "secondary": False, "global_step": gs})
                status = "failed"
                break
            if stage == "load":
                gs = run["start_step"]
                events.append(ev("after_load", counter))
                stream(events[-1])
            elif stage == "train":
                for _ in range(run["steps"]):
                    gs += 1
                    counter += 1
                    events.append(ev("after_step", counter))
                    stream(events[-1])
            else:
                events.append(ev("at_save", counter))
                stream(events[-1])
        notes = ["fake worker %s" % job["backend"]]
        if run["load"]:
            notes.append("fake worker loaded %s" % job["load_dir"])
        res = {"type": "result", "job_id": job["job_id"], "status": status, "events": events,
               "notes": notes, "timings": {}}
        out.write(json.dumps(res) + "\n")
        out.write(json.dumps({"type": "ready", "job_id": job["job_id"]}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
