"""replay/model_parallel.py against worked examples (computed by hand, not by the code)."""

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
