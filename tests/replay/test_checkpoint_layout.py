"""The replay's checkpoint layout is the training loop's: iter_NNNNNNN/ plus the tracker."""

import os

import pytest

from replay import checkpoint_layout as layout


def test_iteration_folder_has_seven_digits(tmp_path):
    assert layout.iteration_dir(str(tmp_path), 5) == os.path.join(str(tmp_path), "iter_0000005")
    assert layout.iteration_dir(str(tmp_path), 12345678).endswith("iter_12345678")


def test_resume_reads_the_tracker_written_at_save(tmp_path):
    root = str(tmp_path)
    os.makedirs(layout.iteration_dir(root, 3))
    os.makedirs(layout.iteration_dir(root, 7))
    layout.write_tracker(root, 7)
    assert layout.read_tracker(root) == 7
    assert layout.resume_dir(root) == layout.iteration_dir(root, 7)
    assert sorted(os.listdir(root)) == ["iter_0000003", "iter_0000007", layout.TRACKER]


@pytest.mark.parametrize("text,words", [
    (None, "cannot read the checkpoint tracker"),
    ("release", "release checkpoint"),
    ("five", "expected an iteration number"),
    ("-2", "negative iteration"),
])
def test_a_bad_tracker_is_an_error_naming_the_file(tmp_path, text, words):
    root = str(tmp_path)
    if text is not None:
        (tmp_path / layout.TRACKER).write_text(text)
    with pytest.raises(layout.LayoutError) as e:
        layout.read_tracker(root)
    assert words in str(e.value) and layout.TRACKER in str(e.value)


def test_a_tracker_naming_a_missing_folder_is_an_error(tmp_path):
    layout.write_tracker(str(tmp_path), 4)
    with pytest.raises(layout.LayoutError, match="iter_0000004, which does not exist"):
        layout.resume_dir(str(tmp_path))
