"""load_lm_eval_task reads its YAML as every lightprune reader does: a special file or an empty one is said as such,
naming the file (before, /dev/null read as an empty task and an empty file as "not a mapping")."""

from __future__ import annotations

import pytest

from lightprune.callbacks.evaluate import load_lm_eval_task


def test_a_task_file_that_cannot_be_read_is_said_to_be_what_it_is(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^lm_eval task file '/dev/null' is not a regular file \(a character "
                                         r"device\): name the lm_eval task file itself$"):
        load_lm_eval_task("/dev/null")
    (tmp_path / "task.yaml").write_text("")
    with pytest.raises(ValueError, match=rf"^lm_eval task file {str(tmp_path / 'task.yaml')!r} is empty \(0 bytes\)"):
        load_lm_eval_task(tmp_path / "task.yaml")
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a file: name the lm_eval task file itself$"):
        load_lm_eval_task(tmp_path)
