import copy
import json
import os

import pytest

from replay import plan as plan_mod
from replay import trace_schema as ts

from helpers import ROOT, synthetic, write_json

BUNDLED = sorted(n[:-5] for n in os.listdir(os.path.join(ROOT, "scenarios")) if n.endswith(".json"))


@pytest.mark.parametrize("name", BUNDLED)
def test_synthetic_plans_of_bundled_scenarios_are_valid(name):
    plan = synthetic(name)
    assert plan_mod.validate_plan(plan) == []
    assert plan_mod.check_gradient_sums(plan) == []


def test_plan_structure_of_bug2():
    plan = synthetic("bug2-step-reset-dp2-to-4")
    runs = plan["runs"]
    assert [(r["id"], r["dp"], r["start_step"], r["steps"], r["load"], r["save"]) for r in runs] == [
        ("reference", 2, 0, 8, False, False), ("phase0", 2, 0, 5, False, True), ("phase1", 4, 5, 3, True, True)]
    assert plan["revisions"]["upstream-2874"]["upstream"] == {
        "repo": "NVIDIA/Megatron-LM", "commit": "f4502eb1c92f77e0ed190cac00293e8ac192543b"}
    assert plan_mod.load_source(plan, 2) == "phase0"
    assert plan_mod.load_source(plan, 1) is None
    assert plan_mod.split_offsets(plan) == [("w0", 0, 1000), ("w1", 1000, 1600)]
    g = plan_mod.rank_gradients(plan, runs[2], 3)
    assert len(g) == 3 and all(len(b) == 1600 * 4 for b in g)
    assert plan_mod.unsupported_reason(plan) is None


def test_plan_of_a_tp_pp_reshard_names_the_sizes_on_its_runs():
    plan = synthetic("fully-reshardable-reshards-tp-pp-dp-upstream-head")
    assert [(r["id"], r.get("tp"), r.get("pp"), r["dp"]) for r in plan["runs"]] == [
        ("reference", 2, 2, 2), ("phase0", 2, 2, 2), ("phase1", None, None, 3), ("phase2", 4, 2, 1)]
    # One gradient per DP rank, each over the whole model (1536 * 3 + 1024 + 2048 + 1024 elements).
    assert [len(r["grads"][0]) for r in plan["runs"]] == [2, 2, 3, 1]
    assert all(len(b) == 8704 * 4 for b in plan_mod.rank_gradients(plan, plan["runs"][3], 0))
    assert plan_mod.params(plan)[2]["shape"] == [32, 48] and plan_mod.params(plan)[2]["tp_split"] == "row"
    assert plan_mod.params(plan)[3]["tp_split"] == "replicated" and plan_mod.params(plan)[4]["layer"] == 1


def _tp_mut(fn):
    plan = copy.deepcopy(synthetic("fully-reshardable-reshards-tp-pp-dp-upstream-head"))
    fn(plan)
    return plan_mod.validate_plan(plan)


@pytest.mark.parametrize("mutation,needle", [
    (lambda p: p["scenario"]["params"][0].update(shape=[48, 31]), "scenario.params[0].shape"),
    (lambda p: p["scenario"]["params"][0].update(tp_split="diagonal"), "scenario.params[0].tp_split"),
    (lambda p: p["scenario"]["params"][3].update(tp_split="row"), "scenario.params[3].tp_split"),
    (lambda p: p["scenario"]["params"][1].update(layer="x"), "scenario.params[1].layer"),
    (lambda p: p["scenario"]["phases"][2].update(tp=5), "scenario.phases[2].tp"),
    (lambda p: p["scenario"]["phases"][2].update(pp=3), "scenario.phases[2].pp"),
    (lambda p: p["runs"][3].update(tp=2), "runs[3].tp"),
    (lambda p: p["runs"][2].update(pp=2), "runs[2].pp"),
    (lambda p: p["runs"][0].pop("tp"), "runs[0].tp"),
])
def test_invalid_tp_pp_plans_are_rejected(mutation, needle):
    errs = _tp_mut(mutation)
    assert errs and any(needle in e for e in errs), errs


def test_load_plan_reads_and_names_the_file(tmp_path):
    plan = synthetic("torch-adamw-resume-asserts")
    p = write_json(tmp_path, "p.json", plan)
    assert plan_mod.load_plan(p)["scenario"]["name"] == "torch-adamw-resume-asserts"
    bad = copy.deepcopy(plan)
    bad["runs"][1]["grads"][0][0] = ts.encode_f32([0.0])
    p2 = write_json(tmp_path, "bad.json", bad)
    with pytest.raises(plan_mod.PlanError) as e:
        plan_mod.load_plan(p2)
    assert "bad.json" in str(e.value) and "runs[1].grads[0][0]" in str(e.value)
    with open(os.path.join(str(tmp_path), "broken.json"), "w") as f:
        f.write("{")
    with pytest.raises(plan_mod.PlanError):
        plan_mod.load_plan(os.path.join(str(tmp_path), "broken.json"))


def _mut(fn):
    plan = copy.deepcopy(synthetic("torch-adamw-resume-asserts"))
    fn(plan)
    return plan_mod.validate_plan(plan)


@pytest.mark.parametrize("mutation,needle", [
    (lambda p: p.update(format="x"), "format"),
    (lambda p: p.update(version=2), "version"),
    (lambda p: p.update(unknown=1), "unknown"),
    (lambda p: p["scenario"]["params"][0].update(dtype="fp16"), "dtype"),
    (lambda p: p["scenario"]["params"][1].update(name="a"), "name"),
    (lambda p: p["scenario"]["optimizer"].update(kind="sgd"), "kind"),
    (lambda p: p["scenario"].update(sharding_type="fully"), "scenario.sharding_type"),
    (lambda p: p["scenario"]["phases"][1].update(sharding_type=3), "scenario.phases[1].sharding_type"),
    (lambda p: p["scenario"].update(fully_reshardable_mem_efficient="yes"), "mem_efficient"),
    (lambda p: p["revisions"]["upstream-2874"].update(upstream={"repo": "me/Megatron", "commit": "abc1234"}), "repo"),
    (lambda p: p["revisions"]["upstream-2874"].update(upstream={"repo": "NVIDIA/Megatron-LM", "commit": "xyz"}),
     "commit"),
    (lambda p: p["initial_params"].pop("a"), "initial_params.a"),
    (lambda p: p["initial_params"].update(a=ts.encode_f32([0.0])), "initial_params.a"),
    (lambda p: p["runs"].pop(0), "runs"),
    (lambda p: p["runs"][1].update(dp=3), "dp"),
    (lambda p: p["runs"][2].update(start_step=0), "start_step"),
    (lambda p: p["runs"][2].update(load=False), "load"),
    (lambda p: p["runs"][1]["grads"].pop(), "grads"),
    (lambda p: p["runs"][1]["grads"][0].pop(), "grads[0]"),
    (lambda p: p["runs"][2].update(load_from="phase9"), "load_from"),
    (lambda p: p["runs"][1].update(revision="nope"), "revision"),
    (lambda p: p["scenario"]["phases"][0].update(revision="nope"), "revision"),
])
def test_invalid_plans_are_rejected(mutation, needle):
    errs = _mut(mutation)
    assert errs and any(needle in e for e in errs), errs


def test_phase_format_follows_the_scenario_unless_the_phase_names_its_own():
    sc = {"sharding_type": "fully_reshardable", "fully_reshardable_mem_efficient": True,
          "phases": [{}, {"sharding_type": "dp_reshardable"}, {"fully_reshardable_mem_efficient": False},
                     {"sharding_type": "fully_reshardable"}]}
    assert [plan_mod.phase_format(sc, i) for i in range(4)] == [
        ("fully_reshardable", True), ("dp_reshardable", False), ("fully_reshardable", False),
        ("fully_reshardable", False)]
    assert plan_mod.phase_format({"phases": [{}]}, 0) == ("dp_reshardable", False)


def test_save_metadata_is_the_training_loops():
    sc = {"sharding_type": "fully_reshardable", "phases": [{}, {"sharding_type": "dp_zero_gather_scatter"}]}
    assert plan_mod.save_metadata(sc, 0) == {
        "distrib_optim_sharding_type": "fully_reshardable", "distrib_optim_fully_reshardable_mem_efficient": False,
        "singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    assert plan_mod.save_metadata(sc, 1) == {
        "distrib_optim_sharding_type": "dp_zero_gather_scatter", "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True}


def test_gradient_sum_check_finds_a_changed_element():
    plan = copy.deepcopy(synthetic("bug2-step-reset-dp2-to-4"))
    vals = ts.decode_f32(plan["runs"][2]["grads"][1][3])
    vals[7] += 1.0
    plan["runs"][2]["grads"][1][3] = ts.encode_f32(vals)
    probs = plan_mod.check_gradient_sums(plan)
    assert probs and "global step 7 element 7" in probs[0]


def test_module_order_is_own_params_then_submodules():
    assert plan_mod.module_order(["embedding", "layers.0.qkv", "layers.0.norm", "layers.1.fc", "head"]) == [
        "embedding", "head", "layers.0.qkv", "layers.0.norm", "layers.1.fc"]
    assert plan_mod.module_order(["a.x", "b", "a.y"]) == ["b", "a.x", "a.y"]
    assert plan_mod.module_order(["a", "a.b"]) is None  # a is a param and a submodule
    assert plan_mod.module_order(["a..b"]) is None


def test_unsupported_param_names():
    plan = synthetic("fully-reshardable-reshards-tp-pp-dp-upstream-head")
    assert plan_mod.unsupported_reason(plan) is None  # embedding, layers.0.*, layers.1.*: in tree order
    names = [p["name"] for p in plan["scenario"]["params"]]
    assert names[0] == "embedding"
    plan["scenario"]["params"][5]["name"] = "final_norm"  # the root's own: before layers.* in the module
    why = plan_mod.unsupported_reason(plan)
    assert why and "yields 'final_norm' at position 1 where the scenario has 'layers.0.qkv'" in why
    plan["scenario"]["params"][0]["name"] = "layers.0.qkv.bias"
    assert "module tree" in plan_mod.unsupported_reason(plan)


def test_plan_paths_expands_folders(tmp_path):
    for n in ("b.json", "a.json", "notes.txt"):
        open(os.path.join(str(tmp_path), n), "w").close()
    assert [os.path.basename(p) for p in plan_mod.plan_paths([str(tmp_path)])] == ["a.json", "b.json"]
    assert plan_mod.plan_paths(["x.json"]) == ["x.json"]


def test_plan_json_round_trips_through_json():
    plan = synthetic("bug1-duplicate-leaf-dp2-to-2")
    again = json.loads(json.dumps(plan))
    assert plan_mod.validate_plan(again) == []
    assert set(again["revisions"]) == {"miles-main", "upstream-2874"}


# --finetune (a phase's "finetune"): no_load_optim's rules, and no job of no steps that saves
# (sim/scenario.cpp).
def _finetune_errors(fn):
    return [e for e in _mut(fn) if "finetune" in e]


def test_finetune_on_a_resumed_phase_is_valid():
    assert _mut(lambda p: p["scenario"]["phases"][1].update(finetune=True)) == []


@pytest.mark.parametrize("fields, error", [
    ({"finetune": "yes"}, "must be true or false, got 'yes'"),
    ({"finetune": True, "steps": 0}, "a --finetune job of no steps ends at iteration 0, where the training loop "
                                     "makes no save; give it steps or \"save\": false"),
])
def test_finetune_errors_name_the_field(fields, error):
    assert _finetune_errors(lambda p: p["scenario"]["phases"][1].update(fields)) == [
        "scenario.phases[1].finetune: " + error]


def test_finetune_in_the_first_phase_or_with_storage_faults_is_rejected():
    assert _finetune_errors(lambda p: p["scenario"]["phases"][0].update(finetune=True)) == [
        "scenario.phases[0].finetune: the first phase loads no checkpoint"]

    def mutate(p):
        p["scenario"]["phases"][0]["storage_faults"] = [{"kind": "crash_before", "file": "shard"}]
        p["scenario"]["phases"][1]["finetune"] = True

    errs = _finetune_errors(mutate)
    assert len(errs) == 1 and errs[0].startswith("scenario.phases[1].finetune: not modeled together with "
                                                 "storage_faults"), errs


# --no-load-optim (a phase's "no_load_optim"): ckptsim's scenario parser's rules (sim/scenario.cpp).
def _no_load_optim_errors(fn):
    return [e for e in _mut(fn) if "no_load_optim" in e]


def test_no_load_optim_on_a_resumed_phase_is_valid():
    assert _mut(lambda p: p["scenario"]["phases"][1].update(no_load_optim=True)) == []
    assert _mut(lambda p: p["scenario"]["phases"][0].update(no_load_optim=False)) == []  # the default, spelled


def test_no_load_optim_must_be_a_boolean():
    errs = _no_load_optim_errors(lambda p: p["scenario"]["phases"][1].update(no_load_optim="yes"))
    assert errs == ["scenario.phases[1].no_load_optim: must be true or false, got 'yes'"]


def test_no_load_optim_in_the_first_phase_is_rejected():
    errs = _no_load_optim_errors(lambda p: p["scenario"]["phases"][0].update(no_load_optim=True))
    assert errs == ["scenario.phases[0].no_load_optim: the first phase loads no checkpoint"]


@pytest.mark.parametrize("faulty_phase", [1, 0])  # its own phase's faults, and another phase's
def test_no_load_optim_with_storage_faults_is_rejected(faulty_phase):
    def mutate(p):
        p["scenario"]["phases"][faulty_phase]["storage_faults"] = [{"kind": "crash_before", "file": "shard"}]
        p["scenario"]["phases"][1]["no_load_optim"] = True

    errs = _no_load_optim_errors(mutate)
    assert len(errs) == 1 and errs[0].startswith("scenario.phases[1].no_load_optim: not modeled together with "
                                                 "storage_faults"), errs
    # The faults alone are a valid plan: the error is no_load_optim's.
    assert _mut(lambda p: p["scenario"]["phases"][faulty_phase].update(
        storage_faults=[{"kind": "crash_before", "file": "shard"}])) == []


# The precision-aware optimizer's fields of scenario.optimizer (issue 26, low-precision states).
FUSED = "fused-adam-save-before-first-step-upstream-2874"  # kind fused_adam
HYBRID = "finetune-hdo-upstream-head"  # kind hybrid
ADAMW = "torch-adamw-resume-asserts"  # kind torch_adamw


def _optimizer_errors(name, **fields):
    plan = copy.deepcopy(synthetic(name))
    plan["scenario"]["optimizer"].update(fields)
    return plan_mod.validate_plan(plan)


@pytest.mark.parametrize("name,fields", [
    (FUSED, {"precision_aware": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp16",
             "main_params_dtype": "fp32", "store_param_remainders": False}),
    (FUSED, {"precision_aware": True}),
    (FUSED, {"precision_aware": False, "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32",
             "main_params_dtype": "fp32"}),  # the defaults, spelled out
    (HYBRID, {"exp_avg_dtype": "bf16", "store_param_remainders": True}),  # hybrid is precision-aware
    (HYBRID, {"precision_aware": True, "exp_avg_sq_dtype": "fp16"}),
    (ADAMW, {"precision_aware": False, "exp_avg_dtype": "fp32"}),
])
def test_precision_aware_fields_that_are_valid(name, fields):
    assert _optimizer_errors(name, **fields) == []


@pytest.mark.parametrize("name,fields,error", [
    (FUSED, {"precision_aware": "yes"}, "scenario.optimizer.precision_aware: must be true or false, got 'yes'"),
    (ADAMW, {"precision_aware": True},
     "scenario.optimizer.precision_aware: not with kind \"torch_adamw\" (Megatron builds torch AdamW only without "
     "TE, and --use-precision-aware-optimizer needs TE's FusedAdam), got true"),
    (HYBRID, {"precision_aware": False},
     "scenario.optimizer.precision_aware: kind \"hybrid\" always runs precision-aware (Megatron's arguments require "
     "--use-precision-aware-optimizer with --optimizer-cpu-offload): leave it out or set it true, got false"),
    (FUSED, {"precision_aware": True, "exp_avg_dtype": "fp64"},
     "scenario.optimizer.exp_avg_dtype: must be one of \"fp32\", \"bf16\", \"fp16\", got 'fp64'"),
    (FUSED, {"precision_aware": True, "exp_avg_sq_dtype": 16},
     "scenario.optimizer.exp_avg_sq_dtype: must be one of \"fp32\", \"bf16\", \"fp16\", got 16"),
    (FUSED, {"precision_aware": True, "exp_avg_dtype": "fp8"},
     "scenario.optimizer.exp_avg_dtype: 'fp8' is not modeled: FP8 states need TE's Float8Tensor "
     "(allowed: \"fp32\", \"bf16\", \"fp16\")"),
    (HYBRID, {"exp_avg_sq_dtype": "fp8"},
     "scenario.optimizer.exp_avg_sq_dtype: 'fp8' is not modeled: FP8 states need TE's Float8Tensor "
     "(allowed: \"fp32\", \"bf16\", \"fp16\")"),
    (FUSED, {"exp_avg_dtype": "bf16"},
     "scenario.optimizer.exp_avg_dtype: 'bf16' needs a precision-aware optimizer (precision_aware true, or kind "
     "\"hybrid\"); without it Megatron asserts \"fp32\""),
    (ADAMW, {"exp_avg_sq_dtype": "fp16"},
     "scenario.optimizer.exp_avg_sq_dtype: 'fp16' needs a precision-aware optimizer (precision_aware true, or kind "
     "\"hybrid\"); without it Megatron asserts \"fp32\""),
    (FUSED, {"precision_aware": True, "main_params_dtype": "fp16"},
     "scenario.optimizer.main_params_dtype: 'fp16' is not modeled: fp16 master weights (TE keeps them scaled, with "
     "their own scale) (allowed: \"fp32\")"),
    (FUSED, {"precision_aware": True, "main_params_dtype": "bf16"},
     "scenario.optimizer.main_params_dtype: must be one of \"fp32\", got 'bf16'"),
    (FUSED, {"precision_aware": True, "store_param_remainders": "no"},
     "scenario.optimizer.store_param_remainders: must be true or false, got 'no'"),
    (FUSED, {"store_param_remainders": True},
     "scenario.optimizer.store_param_remainders: applies only to a precision-aware optimizer (precision_aware "
     "true, or kind \"hybrid\"), got True"),
    (ADAMW, {"store_param_remainders": False},
     "scenario.optimizer.store_param_remainders: applies only to a precision-aware optimizer (precision_aware "
     "true, or kind \"hybrid\"), got False"),
])
def test_precision_aware_field_errors_name_the_field(name, fields, error):
    assert _optimizer_errors(name, **fields) == [error]


def test_optimizer_precision_fills_the_defaults():
    fused = synthetic(FUSED)
    assert plan_mod.optimizer_precision(fused) == {
        "precision_aware": False, "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32", "main_params_dtype": "fp32",
        "store_param_remainders": True, "te_precision_aware": False}
    fused["scenario"]["optimizer"].update(precision_aware=True, exp_avg_dtype="bf16", store_param_remainders=False)
    got = plan_mod.optimizer_precision(fused["scenario"])  # a scenario works as well as its plan
    assert got == {"precision_aware": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp32",
                   "main_params_dtype": "fp32", "store_param_remainders": False, "te_precision_aware": True}
    # The hybrid runs precision-aware, but its sub-optimizers get none of the dtypes.
    hybrid = plan_mod.optimizer_precision(synthetic(HYBRID, optimizer=dict(
        synthetic(HYBRID)["scenario"]["optimizer"], exp_avg_dtype="bf16")))
    assert hybrid["precision_aware"] and not hybrid["te_precision_aware"] and hybrid["exp_avg_dtype"] == "bf16"


# Expert params and EP (issue 26, MoE chained optimizers).
from helpers import expert_scenario, synthetic_of  # noqa: E402


def test_an_expert_plan_is_valid_and_its_reduced_gradients_agree():
    plan = synthetic_of(expert_scenario())
    assert plan_mod.validate_plan(plan) == []
    assert plan_mod.check_gradient_sums(plan) == []
    ps = plan_mod.params(plan)
    assert [p["expert"] for p in ps] == [False, True] and ps[1]["shape"] == [8, 6]


def _expert_mut(fn):
    plan = copy.deepcopy(synthetic_of(expert_scenario()))
    fn(plan)
    return plan_mod.validate_plan(plan)


@pytest.mark.parametrize("mutation,needle", [
    (lambda p: p["scenario"]["params"][1].update(expert="yes"),
     "scenario.params[1].expert: must be true or false, got 'yes'"),
    (lambda p: p["scenario"]["phases"][1].update(ep=3),
     "scenario.phases[1].ep: 3 does not divide the phase's DP size 4"),
    (lambda p: p["scenario"]["phases"][1].update(ep=0), "scenario.phases[1].ep: must be an integer >= 1, got 0"),
    (lambda p: [ph.update(ep=4) for ph in p["scenario"]["phases"]],
     "scenario.phases[0].ep: 4 does not divide the phase's DP size 2"),
    (lambda p: p["scenario"]["phases"][1].update(ep=4),
     "scenario.phases[1].ep: 4 where phases[0] has 2: an EP change between phases is not modeled"),
    (lambda p: p["scenario"]["phases"][1].update(tp=2),
     "scenario.phases[1].tp: expert params with TP or PP are not modeled yet"),
    (lambda p: p["scenario"]["phases"][0].update(pp=2),
     "scenario.phases[0].pp: expert params with TP or PP are not modeled yet"),
    (lambda p: p["scenario"]["params"][1].update(shape=[3, 16]),
     "scenario.phases[0].ep: 2 does not divide dim 0 (3) of params[1]"),
    (lambda p: p["scenario"]["params"][0].update(expert=True),
     "scenario.params: every param is expert: a model without a dense param"),
])
def test_expert_plan_mutations_are_rejected(mutation, needle):
    errs = _expert_mut(mutation)
    assert any(needle in e for e in errs), errs


def test_reduced_gradient_sums_an_expert_piece_over_its_expert_dp_group_only():
    plan = synthetic_of(expert_scenario())
    # DP 4, EP 2: dense elements 0..39 summed over all ranks; the expert param's EP piece 0
    # (elements 40..63) over ranks {0, 2}, piece 1 (64..87) over ranks {1, 3}.
    per_rank = [[float(r + 1)] * 88 for r in range(4)]
    got = plan_mod.reduced_gradient(plan, per_rank)
    assert got[:40] == [10.0] * 40
    assert got[40:64] == [1.0 + 3.0] * 24
    assert got[64:88] == [2.0 + 4.0] * 24


def test_gradient_sum_check_finds_an_expert_gradient_moved_to_a_rank_that_never_reads_it():
    # Rank 0 (EP rank 0) gives up 0.5 of expert element 40 (EP piece 0) to rank 1 (EP rank 1,
    # which writes only piece 1): the plain sum over ranks is unchanged, the gradient Megatron
    # reduces for piece 0 (over the expert-DP group {0, 2}) is not.
    plan = copy.deepcopy(synthetic_of(expert_scenario()))
    grads = plan["runs"][2]["grads"][0]
    a, b = ts.decode_f32(grads[0]), ts.decode_f32(grads[1])
    a[40] -= 0.5
    b[40] += 0.5
    grads[0], grads[1] = ts.encode_f32(a), ts.encode_f32(b)
    probs = plan_mod.check_gradient_sums(plan)
    assert probs and "global step 4 element 40" in probs[0], probs


def test_the_expert_gradients_of_an_ep_group_are_its_tokens():
    # samples_per_step 8: at DP 4 a rank has 2 samples, its EP group (2 ranks) 4; at DP 2 a rank
    # has 4 and its EP group (both ranks) 8.
    from replay import synthetic_plan as sp

    plan = synthetic_of(expert_scenario())
    for run, dense, expert in ((plan["runs"][2], 2 / 8, 4 / 8), (plan["runs"][0], 4 / 8, 8 / 8)):
        step = run["start_step"] + 1
        g = [sp.batch_gradient(step, i, e) for i, n in ((0, 40), (1, 48)) for e in range(n)]
        for text in run["grads"][0]:
            local = ts.decode_f32(text)
            assert local[:40] == [x * dense for x in g[:40]]
            assert local[40:] == [x * expert for x in g[40:]]


def test_expert_params_at_ep_one_are_valid_and_reduced_as_dense_ones():
    # The synthetic marking (a real MoE layer keeps allreduce=True at EP 1): the expert-DP group
    # is every DP rank, and the expert gradient of a rank its own tokens' (its EP group is itself).
    plan = synthetic_of(expert_scenario(ep=1))
    assert plan_mod.validate_plan(plan) == []
    assert plan_mod.check_gradient_sums(plan) == []
    per_rank = [[float(r + 1)] * 88 for r in range(4)]
    assert plan_mod.reduced_gradient(plan, per_rank) == [10.0] * 88
    from replay import synthetic_plan as sp

    run = plan["runs"][2]  # DP 4: 2 of the 8 samples per rank
    g = [sp.batch_gradient(run["start_step"] + 1, i, e) for i, n in ((0, 40), (1, 48)) for e in range(n)]
    assert all(ts.decode_f32(t) == [x * 2 / 8 for x in g] for t in run["grads"][0])
