import copy

from replay import compare

from helpers import minimal_trace


def test_identical_traces_do_not_diverge():
    t = minimal_trace()
    assert compare.first_divergence(t, copy.deepcopy(t)) is None


def test_a_changed_step_counter_is_the_first_divergence():
    a = minimal_trace()
    b = copy.deepcopy(a)
    b["runs"][0]["events"][3]["parts"][0]["step"] = 5.0
    d = compare.first_divergence(a, b)
    assert d == {"run": "reference", "rank": 1, "at": "after_step", "global_step": 1,
                 "what": "step of w0 (HDO cpu AdamW)", "a": 1.0, "b": 5.0}


def test_a_missing_exception_is_a_divergence():
    a = minimal_trace()
    b = copy.deepcopy(a)
    b["runs"][1]["events"] = [e for e in b["runs"][1]["events"] if e["at"] != "error"]
    b["runs"][1]["status"] = "completed"
    d = compare.first_divergence(a, b)
    assert d["run"] == "phase1" and d["what"] == "status"
    d = compare.first_divergence(a, b, fields=("errors",))
    assert d["what"] == "errors" and d["a"][0][2] == "ValueError" and d["b"] == []


def test_a_changed_hash_and_a_changed_key_path():
    a = minimal_trace()
    b = copy.deepcopy(a)
    b["runs"][0]["events"][0]["hashes"]["exp_avg"]["w0"] = "0" * 16
    assert compare.first_divergence(a, b)["what"] == "exp_avg hash of w0"
    c = copy.deepcopy(a)
    c["runs"][1]["events"][0]["merge_path"] = ["'optimizer'"]
    assert compare.first_divergence(a, c)["what"] == "errors"


def test_secondary_errors_are_not_compared():
    a = minimal_trace()
    b = copy.deepcopy(a)
    b["runs"][1]["events"].append({"rank": 1, "at": "error", "stage": "load", "py_type": "PeerAborted",
                                   "message": "", "site": "", "merge_path": None, "secondary": True})
    assert compare.first_divergence(a, b, fields=("errors",)) is None
    assert compare.first_error(b)[1]["py_type"] == "ValueError"


def test_summarize_and_step_expectations():
    t = minimal_trace()
    lines = compare.summarize(t)
    assert lines[0].startswith("trace tiny source=real backend=gloo")
    assert any("ERROR ValueError" in ln and "merge_path=('optimizer', 'step')" in ln for ln in lines)
    rows = compare.step_expectations(t)
    assert rows == []  # phase1 rank 1 holds 1.0 at global step 1
    t["runs"][1]["events"][1]["parts"][0]["step"] = 0.0
    assert compare.step_expectations(t)[0]["step"] == 0.0


def test_a_chain_index_is_shown_and_compared():
    a = minimal_trace()
    a["runs"][0]["events"][2]["parts"][0]["chain"] = 1
    assert any("w0[0:4] HDO cpu AdamW chain=1 step=1" in ln for ln in compare.summarize(a))
    b = copy.deepcopy(a)
    b["runs"][0]["events"][2]["parts"][0]["chain"] = 0
    assert compare.first_divergence(a, b)["what"] == "chain of w0 (HDO cpu AdamW)"
