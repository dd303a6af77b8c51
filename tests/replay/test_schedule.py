"""replay/schedule.py: the scheduler arguments, group overrides and intended schedules the runner
builds from a scenario (torch-free)."""

import os

import pytest

from replay import schedule


def scenario(**phase_fields):
    sc = {"optimizer": {"kind": "fused_adam", "lr": 0.01, "weight_decay": 0.1, "eps": 1e-8,
                        "betas": [0.9, 0.95]},
          "schedule": {"lr_decay_style": "linear", "lr_warmup_iters": 2, "lr_decay_iters": 10},
          "phases": [{"dp": 2, "revision": "upstream-2874", "steps": 3},
                     {"dp": 4, "revision": "upstream-2874", "steps": 2},
                     {"dp": 4, "revision": "upstream-2874", "steps": 1}]}
    for i, fields in phase_fields.items():
        sc["phases"][int(i[1:])].update(fields)
    return sc


def test_the_scenario_schedule_starts_from_the_optimizer_lr_and_weight_decay():
    args = schedule.phase_arguments(scenario(), 0)
    assert (args["lr"], args["start_wd"], args["end_wd"]) == (0.01, 0.1, 0.1)
    assert (args["lr_decay_style"], args["lr_warmup_iters"], args["lr_decay_iters"]) == ("linear", 2, 10)


def test_a_phase_schedule_overlays_the_scenario_schedule():
    sc = scenario(p1={"schedule": {"lr": 0.02, "start_weight_decay": 0.2, "end_weight_decay": 0.2}})
    args = schedule.phase_arguments(sc, 1)
    assert (args["lr"], args["start_wd"], args["lr_decay_style"]) == (0.02, 0.2, "linear")
    assert schedule.phase_arguments(sc, 2)["lr"] == 0.01  # a later phase without one: the scenario's


def test_override_takes_the_new_arguments_use_checkpoint_keeps_the_old_ones():
    new = {"lr": 0.02, "lr_warmup_init": 0.001}
    over = schedule.intended_schedules(scenario(p1={"schedule": new, "opt_param_scheduler": "override"}))
    assert over[1]["lr"] == 0.02 and over[1]["lr_warmup_init"] == 0.001
    kept = schedule.intended_schedules(scenario(p1={"schedule": new, "opt_param_scheduler": "use_checkpoint"}))
    assert kept[1]["lr"] == 0.01
    assert kept[1]["lr_warmup_init"] == 0.001  # not in any checkpoint: the arguments'
    assert kept[2]["lr"] == 0.01  # phase 2 (neither, the scenario's arguments) agrees


def test_the_reference_run_changes_schedule_where_the_intended_schedule_changes():
    sc = scenario(p1={"schedule": {"lr": 0.02}, "opt_param_scheduler": "override"},
                  p2={"schedule": {"lr": 0.02}})
    changes = schedule.reference_changes(sc)
    assert [(first, args["lr"]) for first, args in changes] == [(4, 0.02)]
    assert schedule.reference_changes(scenario()) == []


def test_a_no_load_optim_phase_follows_its_own_arguments_whatever_its_flag():
    new = {"schedule": {"lr": 0.02}, "opt_param_scheduler": "use_checkpoint"}
    kept = schedule.intended_schedules(scenario(p1=new))
    fresh = schedule.intended_schedules(scenario(p1=dict(new, no_load_optim=True)))
    assert kept[1]["lr"] == 0.01  # the checkpoint's scheduler, loaded
    assert fresh[1]["lr"] == 0.02  # no scheduler loaded: the phase's own arguments
    assert [i["lr"] for i in fresh] == [0.01, 0.02, 0.01]
    # The reference run changes its schedule there too (and restarts its optimizer: below).
    assert [(first, args["lr"]) for first, args in schedule.reference_changes(
        scenario(p1=dict(new, no_load_optim=True)))] == [(4, 0.02), (6, 0.01)]


@pytest.mark.parametrize("phases, restarts", [
    ((), []),
    ((1,), [4]),       # steps 3, 2, 1: phase 1 resumes before global step 4
    ((2,), [6]),
    ((1, 2), [4, 6]),
])
def test_the_reference_run_restarts_where_a_no_load_optim_phase_resumes(phases, restarts):
    sc = scenario(**{"p%d" % i: {"no_load_optim": True} for i in phases})
    assert schedule.reference_restarts(sc) == restarts
    sc["phases"][1]["no_load_optim"] = False  # spelled false: no restart
    assert schedule.reference_restarts(sc) == [r for r in restarts if r != 4]


@pytest.mark.parametrize("flag", ["no_load_optim", "finetune"])
def test_a_finetune_phase_restarts_the_reference_as_no_load_optim_does(flag):
    sc = scenario(p1={flag: True, "schedule": {"lr": 0.02}, "opt_param_scheduler": "use_checkpoint"})
    assert schedule.reference_restarts(sc) == [4]
    assert [i["lr"] for i in schedule.intended_schedules(sc)] == [0.01, 0.02, 0.01]
    assert schedule.fresh_optimizer(sc, 1) and not schedule.fresh_optimizer(sc, 2)


@pytest.mark.parametrize("phases, origins", [
    ((), [0, 0, 0]),
    ((1,), [0, 3, 3]),  # steps 3, 2, 1: phase 1 counts from iteration 0 at global step 3
    ((2,), [0, 0, 5]),
    ((1, 2), [0, 3, 5]),
])
def test_iteration_origins_move_where_a_finetune_phase_resumes(phases, origins):
    sc = scenario(**{"p%d" % i: {"finetune": True} for i in phases})
    assert schedule.iteration_origins(sc) == origins
    # --no-load-optim keeps the iteration.
    assert schedule.iteration_origins(scenario(**{"p%d" % i: {"no_load_optim": True} for i in phases})) == [0, 0, 0]


@pytest.mark.parametrize("phases, phase, loaded, want", [
    ((), 1, 3, (3, 0)),         # a plain resume: the checkpoint's iteration, global step 3
    ((1,), 1, 3, (0, 3)),       # --finetune: iteration 0 at global step 3
    ((1,), 2, 2, (2, 3)),       # the next job loads the finetune job's iteration 2: global step 5
    ((1, 2), 2, 2, (0, 5)),     # finetuned again: iteration 0 at global step 5
])
def test_resumed_iteration_counts_from_zero_after_finetune(phases, phase, loaded, want):
    sc = scenario(**{"p%d" % i: {"finetune": True} for i in phases})
    assert schedule.resumed_iteration(sc, phase, loaded) == want
    iteration, origin = want
    assert origin + iteration == {1: 3, 2: 5}[phase]  # the global step the phase resumes at


def test_scheduler_kwargs_count_samples_and_carry_the_flag():
    kw = schedule.scheduler_kwargs(schedule.phase_arguments(scenario(), 0), 8, "use_checkpoint")
    assert (kw["lr_warmup_steps"], kw["lr_decay_steps"], kw["wd_incr_steps"]) == (16, 80, 8)
    assert (kw["max_lr"], kw["init_lr"], kw["lr_decay_style"]) == (0.01, 0.0, "linear")
    assert kw["use_checkpoint_opt_param_scheduler"] and not kw["override_opt_param_scheduler"]


def test_a_group_with_an_lr_mult_gets_its_own_bounds():
    args = dict(schedule.phase_arguments(scenario(), 0), min_lr=0.001)
    assert schedule.group_override(1.0, 1.0, args) == {}
    assert schedule.group_override(0.0, 1.0, args) == {"wd_mult": 0.0}
    assert schedule.group_override(1.0, 2.0, args) == {"lr_mult": 2.0, "max_lr": 0.02, "min_lr": 0.002}


LOAD = "    opt_param_scheduler.load_state_dict(state_dict['opt_param_scheduler'])\n"
REAPPLY = ("if getattr(args, 'override_opt_param_scheduler', False):\n"
           "    for param_group in optimizer.param_groups:\n"
           "        param_group[\"max_lr\"] = args.lr\n")


@pytest.mark.parametrize("text, expected", [
    (LOAD + REAPPLY, True),
    (LOAD, False),                       # no block after the load
    (REAPPLY + LOAD, False),             # an override block before the load is another one
    ("", False),
])
def test_which_training_loop_reapplies_the_lr_bounds(text, expected):
    assert schedule.reapplies_lr_bounds(text) is expected


RESET = ("    if opt_param_scheduler.num_steps != args.consumed_train_samples:\n"
         "        opt_param_scheduler.num_steps = args.consumed_train_samples\n")


@pytest.mark.parametrize("text, expected", [
    (LOAD + REAPPLY + RESET, True),
    (LOAD + REAPPLY, False),             # HEAD's block without the reset
    (RESET + LOAD + REAPPLY, False),     # a reset before the load is not the block's
    (LOAD + RESET, False),               # no override block after the load
    ("", False),
])
def test_which_training_loop_resets_the_scheduler_num_steps(text, expected):
    assert schedule.resets_num_steps(text) is expected


def _megatron_checkpointing_py(label):
    root = os.environ.get("CKPTSIM_MEGATRON_ROOT",
                          os.path.join(os.path.dirname(__file__), "..", "..", ".megatron"))
    path = os.path.join(root, label, "megatron", "training", "checkpointing.py")
    if not os.path.isfile(path):
        pytest.skip("no extracted Megatron %s: run replay/fetch-megatron.sh or set CKPTSIM_MEGATRON_ROOT" % label)
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("label, expected", [
    ("nv-d98e8a64dd", True),    # upstream-head: checkpointing.py:3041
    ("nv-f4502eb1c9", False),   # upstream-2874
    ("rx-2e64d788b6", False),   # miles-main
])
def test_the_real_training_loops(label, expected):
    text = _megatron_checkpointing_py(label)
    assert schedule.reapplies_lr_bounds(text) is expected
    assert schedule.resets_num_steps(text) is expected


def test_validation_names_the_field():
    problems = []
    sc = scenario(p1={"schedule": {"lr_decay_style": "stepwise"}, "opt_param_scheduler": "both"})
    sc["schedule"]["lr"] = 0.02
    schedule.validate(sc, lambda path, what: problems.append(path))
    assert problems == ["scenario.schedule.lr", "scenario.phases[1].schedule.lr_decay_style",
                        "scenario.phases[1].opt_param_scheduler"]
