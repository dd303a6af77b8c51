"""replay/model_parallel.py against worked examples (computed by hand, not by the code)."""

import pytest

from replay import model_parallel as mp


def test_place_numbers_ranks_tp_fastest_then_dp_then_pp():
    # TP 2 x DP 3 x PP 2: rank = tp_rank + 2 * (dp_rank + 3 * pp_rank)
    assert mp.place(0, 2, 3) == (0, 0, 0)
    assert mp.place(1, 2, 3) == (1, 0, 0)
    assert mp.place(2, 2, 3) == (0, 1, 0)
    assert mp.place(5, 2, 3) == (1, 2, 0)
    assert mp.place(6, 2, 3) == (0, 0, 1)
    assert mp.place(11, 2, 3) == (1, 2, 1)


def test_column_split_is_one_contiguous_run_per_rank():
    p = {"name": "w", "numel": 12, "shape": [4, 3], "tp_split": "column"}
    assert mp.element_runs(p, 2, 0) == [(0, 6)]
    assert mp.element_runs(p, 2, 1) == [(6, 6)]
    assert mp.local_shape(p, 2) == [2, 3]


def test_row_split_is_one_run_per_row_at_tp_above_one():
    # [3, 4] split on dim 1 over 2 ranks: rank 1 holds columns 2..3 of each row.
    p = {"name": "w", "numel": 12, "shape": [3, 4], "tp_split": "row"}
    assert mp.element_runs(p, 2, 1) == [(2, 2), (6, 2), (10, 2)]
    assert mp.local_shape(p, 2) == [3, 2]


def test_row_split_at_tp_one_is_the_whole_param_in_one_run():
    p = {"name": "w", "numel": 12, "shape": [3, 4], "tp_split": "row"}
    assert mp.element_runs(p, 1, 0) == [(0, 12)]


def test_replicated_param_is_whole_on_every_tp_rank():
    p = {"name": "b", "numel": 5}
    assert mp.element_runs(p, 4, 3) == [(0, 5)]
    assert mp.local_shape(p, 4) == [5]


def test_global_ranges_cut_a_shard_of_the_piece_at_the_runs():
    runs = [(2, 2), (6, 2), (10, 2)]  # the row-split piece above
    assert mp.global_ranges(runs, 1, 5) == [(3, 4), (6, 8), (10, 11)]
    assert mp.global_ranges(runs, 0, 2) == [(2, 4)]
    assert mp.global_ranges(runs, 4, 4) == []


def test_stage_params_by_layer():
    params = [{"name": "a", "numel": 1, "layer": 0}, {"name": "b", "numel": 1, "layer": 1},
              {"name": "c", "numel": 1, "layer": 2}, {"name": "d", "numel": 1, "layer": 3}]
    assert mp.stage_params(params, 2, 0) == [0, 1]
    assert mp.stage_params(params, 2, 1) == [2, 3]
    assert mp.stage_params(params, 4, 2) == [2]
    assert mp.stage_params(params, 1, 0) == [0, 1, 2, 3]


def test_world_size_defaults_tp_and_pp_to_one():
    assert mp.world_size({"dp": 3}) == 3
    assert mp.world_size({"dp": 3, "tp": 2, "pp": 2}) == 12


def test_param_problem_names_the_field():
    assert mp.param_problem({"name": "w", "numel": 6, "shape": [2, 3]}, "params[0]") is None
    assert mp.param_problem({"name": "w", "numel": 7, "shape": [2, 3]}, "params[0]")[0] == "params[0].shape"
    assert mp.param_problem({"name": "w", "numel": 6, "tp_split": "diagonal"}, "params[0]")[0] == "params[0].tp_split"
    assert mp.param_problem({"name": "w", "numel": 6, "tp_split": "row"}, "params[0]")[0] == "params[0].tp_split"
    assert mp.param_problem({"name": "w", "numel": 6, "layer": -1}, "params[0]")[0] == "params[0].layer"


def test_phase_problem_tp_must_divide_the_split_dim():
    params = [{"name": "w", "numel": 6, "shape": [3, 2], "tp_split": "column"}]
    field, why = mp.phase_problem(params, {"tp": 2}, "phases[1]")
    assert field == "phases[1].tp"
    assert "does not divide dim 0 (3)" in why
    assert mp.phase_problem(params, {"tp": 3}, "phases[1]") is None


def test_phase_problem_pp_needs_a_param_on_every_stage():
    params = [{"name": "a", "numel": 1, "layer": 0}, {"name": "b", "numel": 1, "layer": 3}]
    assert mp.phase_problem(params, {"pp": 2}, "phases[0]") is None  # layers 0-1 and 2-3
    field, why = mp.phase_problem(params, {"pp": 4}, "phases[0]")
    assert (field, why) == ("phases[0].pp", "stage 1 (layers 1 to 1) holds no param")
    assert mp.phase_problem(params, {"pp": 3}, "phases[0]")[0] == "phases[0].pp"  # 4 layers, 3 stages
    assert mp.phase_problem(params, {"pp": 0}, "phases[0]")[0] == "phases[0].pp"


# Expert parallelism (issue 26). Worked examples from parallel_state's expert rank generator
# (order tp-cp-ep-dp-pp, expert TP = TP, no CP), computed by hand.
def test_expert_place_at_tp_pp_one_is_rank_mod_ep_and_rank_div_ep():
    # DP 4, EP 2: EP groups {0,1}, {2,3}; expert-DP groups {0,2}, {1,3}.
    assert [mp.expert_place(r, 1, 4, 2) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # DP 2, EP 2: EP group {0,1}; expert-DP groups {0}, {1}.
    assert [mp.expert_place(r, 1, 2, 2) for r in range(2)] == [(0, 0), (1, 0)]
    # EP 1: every rank EP rank 0, the expert-DP rank its DP rank.
    assert [mp.expert_place(r, 1, 3, 1) for r in range(3)] == [(0, 0), (0, 1), (0, 2)]


def test_expert_place_with_tp_and_pp_counts_tp_fastest():
    # TP 2 x DP 4 x PP 2, EP 2 (expert DP 2): rank = tp + 2 * (ep + 2 * (edp + 2 * pp)).
    assert mp.expert_place(1, 2, 4, 2) == (0, 0)
    assert mp.expert_place(2, 2, 4, 2) == (1, 0)
    assert mp.expert_place(5, 2, 4, 2) == (0, 1)
    assert mp.expert_place(7, 2, 4, 2) == (1, 1)
    assert mp.expert_place(8 + 6, 2, 4, 2) == (1, 1)  # pp rank 1


def test_expert_dp_group_of_an_ep_rank():
    assert mp.expert_dp_group(0, 2, 4) == [0, 2]
    assert mp.expert_dp_group(1, 2, 4) == [1, 3]
    assert mp.expert_dp_group(1, 2, 2) == [1]
    assert mp.expert_dp_group(0, 1, 3) == [0, 1, 2]
    assert mp.expert_dp_group(3, 4, 8) == [3, 7]


def test_an_expert_param_is_split_over_ep_on_dim_zero():
    p = {"name": "e", "numel": 48, "shape": [8, 6], "expert": True}
    assert mp.element_runs(p, 1, 0, 2, 0) == [(0, 24)]
    assert mp.element_runs(p, 1, 0, 2, 1) == [(24, 24)]
    assert mp.element_runs(p, 1, 0, 4, 3) == [(36, 12)]
    assert mp.local_shape(p, 1, 2) == [4, 6]
    assert mp.local_shape(p, 1, 4) == [2, 6]
    # EP 1: the whole param, as a dense one.
    assert mp.element_runs(p, 1, 0, 1, 0) == [(0, 48)] and mp.local_shape(p, 1, 1) == [8, 6]
    # 1-D: rows are elements.
    q = {"name": "b", "numel": 10, "expert": True}
    assert mp.element_runs(q, 1, 0, 2, 1) == [(5, 5)] and mp.local_shape(q, 1, 2) == [5]
    # A dense param ignores EP.
    d = {"name": "w", "numel": 12, "shape": [4, 3], "tp_split": "column"}
    assert mp.element_runs(d, 2, 1, 2, 1) == [(6, 6)] and mp.local_shape(d, 2, 2) == [2, 3]


def test_ep_pieces_tile_the_expert_param():
    p = {"name": "e", "numel": 48, "shape": [8, 6], "expert": True}
    for ep in (1, 2, 4, 8):
        covered = [x for e in range(ep) for g, n in mp.element_runs(p, 1, 0, ep, e) for x in range(g, g + n)]
        assert covered == list(range(48))


EXPERT = [{"name": "w", "numel": 4}, {"name": "e", "numel": 12, "shape": [6, 2], "expert": True}]


@pytest.mark.parametrize("phase,want", [
    ({"dp": 4, "ep": 2}, None),
    ({"dp": 4, "ep": 0}, ("phases[1].ep", "must be an integer >= 1, got 0")),
    ({"dp": 4, "ep": True}, ("phases[1].ep", "must be an integer >= 1, got True")),
    ({"dp": 6, "ep": 4}, ("phases[1].ep", "4 does not divide the phase's DP size 6 (expert DP = DP / EP)")),
    ({"dp": 4, "ep": 4}, ("phases[1].ep", "4 does not divide dim 0 (6) of params[1] ('e', expert: split over EP "
                                          "on dim 0)")),
    ({"dp": 4, "ep": 2, "tp": 2}, ("phases[1].tp", "expert params with TP or PP are not modeled yet (params[1] "
                                                   "'e' is expert; tp 2, pp 1)")),
    ({"dp": 4, "ep": 1, "pp": 2}, ("phases[1].pp", "expert params with TP or PP are not modeled yet (params[1] "
                                                   "'e' is expert; tp 1, pp 2)")),
])
def test_phase_problem_checks_ep(phase, want):
    assert mp.phase_problem(EXPERT, phase, "phases[1]") == want


def test_ep_without_expert_params_needs_only_to_divide_dp():
    dense = [{"name": "w", "numel": 12, "shape": [4, 3], "tp_split": "column"}]
    assert mp.phase_problem(dense, {"dp": 4, "ep": 4, "tp": 2}, "phases[0]") is None
    assert mp.phase_problem(dense, {"dp": 2, "ep": 4}, "phases[0]")[0] == "phases[0].ep"


def test_scenario_problem_same_ep_everywhere_and_a_dense_param():
    assert mp.scenario_problem(EXPERT, [{"ep": 2}, {"ep": 2}], "scenario") is None
    assert mp.scenario_problem(EXPERT, [{}, {"ep": 1}], "scenario") is None
    assert mp.scenario_problem(EXPERT, [{"ep": 2}, {"ep": 2}, {"ep": 1}], "scenario") == (
        "scenario.phases[2].ep", "1 where phases[0] has 2: an EP change between phases is not modeled")
    assert mp.scenario_problem(EXPERT[1:], [{"ep": 2}], "scenario") == (
        "scenario.params", "every param is expert: a model without a dense param (a stub dense part of the chained "
                           "optimizer) is not modeled yet")


def test_param_problem_expert_is_a_boolean():
    assert mp.param_problem({"name": "e", "numel": 4, "expert": True}, "params[0]") is None
    assert mp.param_problem({"name": "e", "numel": 4, "expert": 1}, "params[0]") == (
        "params[0].expert", "must be true or false, got 1")
