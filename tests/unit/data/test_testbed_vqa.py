"""Testbed VQA: answers recomputed from sklearn's digits and from the charts' pixels, disjoint splits,
byte-identical caches, rebuilds, per-task loaders, label masks through the tiny processors."""

from __future__ import annotations

import hashlib
import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from lightprune.data import TestbedVQADataModule, build_testbed_vqa, testbed_vqa_splits, testbed_vqa_texts
from lightprune.data.generated.testbed_vqa import (
    SYSTEM_PROMPT,
    TESTBED_VQA_TASKS,
    TEXT_COMPLETION_CHARS,
    TEXT_PROMPT,
    text_pool,
)
from lightprune.data.generated.testbed_vqa_pictures import BAR_COLORS, Bar, render_bar_chart, render_digit

SIZES = dict(n_train=40, n_val=24, n_selection=12, n_calibration=12)
SPLITS = ("val", "selection", "calibration", "train")
WORDS = "zero one two three four five six seven eight nine".split()
END = "<|im_end|>\n"


@pytest.fixture(scope="module")
def dm(tmp_path_factory):
    return TestbedVQADataModule("tiny:qwen3_vl_moe", root=str(tmp_path_factory.mktemp("cache")), batch_size=4,
                                **SIZES)


@pytest.fixture(scope="module")
def sklearn_digits():
    from sklearn.datasets import load_digits

    return load_digits()


def _png(dm, row) -> np.ndarray:
    with Image.open(dm.folder / row["image"]) as image:
        assert image.mode == "RGB" and image.size == (32, 32)
        return np.asarray(image.convert("RGB"))


def _bars_from_pixels(pixels: np.ndarray) -> list[tuple[tuple[int, ...], int]]:
    """(colour, height in pixels) of each bar, left to right: runs of columns holding non-background pixels."""
    background = pixels[0, 0]
    drawn = (pixels != background).any(axis=2)
    bars, x = [], 0
    width = pixels.shape[1]
    while x < width:
        if not drawn[:, x].any():
            x += 1
            continue
        start = x
        while x < width and drawn[:, x].any():
            x += 1
        block = pixels[:, start:x][drawn[:, start:x]]
        colours = {tuple(int(v) for v in p) for p in block}
        assert len(colours) == 1, f"a bar of several colours {colours}"
        heights = {int(drawn[:, c].sum()) for c in range(start, x)}
        assert len(heights) == 1, "a bar is not a rectangle"
        bars.append((colours.pop(), heights.pop()))
    return bars


def test_digit_answers_and_pixels_match_sklearn(dm, sklearn_digits):
    checked = 0
    for split in SPLITS:
        for row in dm.rows(split):
            if row["task"] != "digit":
                continue
            index = row["digit"]
            assert row["answer"] == WORDS[int(sklearn_digits.target[index])] == row["messages"][2]["content"]
            assert row["messages"][1]["content"] == "<image>Which digit is written?"
            pixels = _png(dm, row)
            assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()
            # nearest upscaling 8 -> 32: every 4 x 4 block is one sklearn pixel, 0 = white, 16 = black
            blocks = pixels[..., 0].reshape(8, 4, 8, 4)
            assert (blocks == blocks[:, :1, :, :1]).all()
            expected = np.rint(255 - sklearn_digits.images[index] * 255 / 16)
            assert (blocks[:, 0, :, 0] == expected).all()
            assert np.median(pixels) > 200  # dark digit on a light background
            checked += 1
    assert checked == sum(SIZES.values()) // 4


def test_chart_answers_match_the_rendered_pixels(dm):
    names = {rgb: name for name, rgb in BAR_COLORS.items()}
    counts = {2: "two", 3: "three", 4: "four"}
    checked = {"chart_tallest": 0, "chart_count": 0}
    for split in SPLITS:
        for row in dm.rows(split):
            if not row["task"].startswith("chart_"):
                continue
            bars = _bars_from_pixels(_png(dm, row))
            heights = [h for _, h in bars]
            assert 2 <= len(bars) <= 4 and len(set(heights)) == len(heights)
            assert len({c for c, _ in bars}) == len(bars)
            if row["task"] == "chart_tallest":
                assert row["messages"][1]["content"] == "<image>Which colour is the tallest bar?"
                assert names[max(bars, key=lambda b: b[1])[0]] == row["answer"], row
            else:
                assert row["messages"][1]["content"] == "<image>How many bars are there?"
                assert counts[len(bars)] == row["answer"], row
            # the row's own record of what was drawn agrees, colours and height order
            assert [names[c] for c, _ in bars] == [b["color"] for b in row["bars"]]
            assert np.argsort(heights).tolist() == np.argsort([b["height"] for b in row["bars"]]).tolist()
            checked[row["task"]] += 1
    assert checked == {"chart_tallest": 22, "chart_count": 22}
    # other sizes keep the pixel-exact layout
    for size in (16, 33, 64):
        bars = (Bar("red", 2), Bar("blue", 6), Bar("orange", 1), Bar("green", 4))
        found = _bars_from_pixels(np.asarray(render_bar_chart(bars, size)))
        assert [names[c] for c, _ in found] == ["red", "blue", "orange", "green"]
        assert np.argsort([h for _, h in found]).tolist() == [2, 0, 3, 1]


def test_leftmost_colour_answers_match_the_pixels_and_stay_out_of_the_default(tmp_path):
    names = {rgb: name for name, rgb in BAR_COLORS.items()}
    left = TestbedVQADataModule("tiny:qwen3_vl_moe", root=str(tmp_path), batch_size=4, tasks=("chart_left", "digit"),
                                n_train=12, n_val=6, n_selection=4, n_calibration=4)
    answers = []
    for split in SPLITS:
        for row in (r for r in left.rows(split) if r["task"] == "chart_left"):
            bars = _bars_from_pixels(_png(left, row))
            assert row["messages"][1]["content"] == "<image>Which colour is the leftmost bar?"
            assert names[bars[0][0]] == row["answer"] == row["bars"][0]["color"], row
            answers.append(row["answer"])
    assert len(answers) == 13 and len(set(answers)) > 2
    # the default set and its tokenizer texts are those of the testbeds trained before the task existed
    assert "chart_left" not in TESTBED_VQA_TASKS
    assert not any("leftmost" in t for t in testbed_vqa_texts())
    assert "Which colour is the leftmost bar? red" in testbed_vqa_texts(("chart_left", "text"))
    with pytest.raises(ValueError, match="unknown testbed VQA task 'chart_right'"):
        testbed_vqa_texts(("chart_right",))


def test_text_rows_are_held_out_documentation(dm):
    for split in SPLITS:
        for row in dm.rows(split):
            if row["task"] != "text":
                continue
            assert "image" not in row and [m["role"] for m in row["messages"]] == ["user", "assistant"]
            assert 0 < len(row["answer"]) <= TEXT_COMPLETION_CHARS and row["answer"] == row["messages"][1]["content"]
            question = row["messages"][0]["content"]
            assert question.startswith((TEXT_PROMPT, "Explain ", "Describe ", "Write "))
            assert (question, row["answer"], row["topic"]) in text_pool(split)
    texts = set(testbed_vqa_texts())
    assert {SYSTEM_PROMPT, "Which digit is written?", "How many bars are there?"} <= texts
    assert all(any(word in t for t in texts) for word in [*WORDS, *BAR_COLORS])
    train_topics = {topic for _, _, topic in text_pool("train")}
    for split in ("val", "selection", "calibration"):
        assert not {topic for _, _, topic in text_pool(split)} & train_topics
        assert not {answer for _, answer, _ in text_pool(split)} & texts  # no held-out text in the tokenizer's


def test_splits_are_disjoint(dm):
    owner: dict = {}
    topics: dict[str, set] = {split: set() for split in SPLITS}
    for split in SPLITS:
        rows = dm.rows(split)
        assert len(rows) == SIZES[f"n_{split}"]
        for row in rows:
            keys = []
            if "image" in row:
                keys.append(("png", hashlib.sha256((dm.folder / row["image"]).read_bytes()).hexdigest()))
            if "digit" in row:
                keys.append(("digit", row["digit"]))
            if "bars" in row:
                keys.append(("bars", tuple((b["color"], b["height"]) for b in row["bars"])))
            if row["task"] == "text":
                keys.append(("text", row["messages"][0]["content"], row["answer"]))
                topics[split].add(row["topic"])
            for key in keys:
                assert key not in owner, f"{split} repeats a row of {owner.get(key)}"
                owner[key] = split
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not topics[a] & topics[b], (a, b)
    # evaluation splits come first: a larger train set does not move them
    small = testbed_vqa_splits({"val": 8, "train": 4}, seed=5)
    large = testbed_vqa_splits({"val": 8, "train": 40}, seed=5)
    assert small["val"] == large["val"] and small == testbed_vqa_splits({"val": 8, "train": 4}, seed=5)
    assert testbed_vqa_splits({"val": 8}, seed=6)["val"] != small["val"]
    assert [r.task for r in large["train"][:8]] == list(TESTBED_VQA_TASKS) * 2
    # every sklearn digit once, no more
    every = testbed_vqa_splits({"val": 797, "train": 1000}, tasks=("digit",))
    assert sorted(r.digit for rows in every.values() for r in rows) == list(range(1797))


def test_cache_is_byte_identical_across_roots_reused_and_rebuilt(tmp_path, dm):
    other = build_testbed_vqa(tmp_path, {"train": 40, "val": 24, "selection": 12, "calibration": 12})
    assert other.name == dm.folder.name and other != dm.folder
    files = sorted(p.name for p in dm.folder.iterdir())
    assert files == sorted(p.name for p in other.iterdir()) and "manifest.json" in files
    for name in files:
        assert (dm.folder / name).read_bytes() == (other / name).read_bytes(), name
    assert dm.manifest["rows"] == {"val": 24, "selection": 12, "calibration": 12, "train": 40}
    sizes = {"train": 40, "val": 24, "selection": 12, "calibration": 12}
    stamp = (other / "val.jsonl").stat().st_mtime_ns
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid cache is reused silently
        assert build_testbed_vqa(tmp_path, sizes) == other
    assert (other / "val.jsonl").stat().st_mtime_ns == stamp
    png = next(p.name for p in sorted(other.iterdir()) if p.suffix == ".png")
    (other / png).write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="rebuilding the testbed VQA cache"):
        build_testbed_vqa(tmp_path, sizes)
    assert (other / png).read_bytes() == (dm.folder / png).read_bytes()
    manifest = (other / "manifest.json").read_text()
    (other / "manifest.json").write_text(manifest.replace('"sha256": "', '"sha256": "0', 1))
    with pytest.warns(UserWarning, match="rebuilding the testbed VQA cache"):
        build_testbed_vqa(tmp_path, sizes)
    assert (other / "manifest.json").read_text() == manifest
    assert build_testbed_vqa(tmp_path, {**sizes, "train": 41}) != other  # other parameters, another folder
    # rendering twice gives the same PNG bytes
    encoded = []
    for _ in range(2):
        for image in (render_bar_chart((Bar("purple", 3), Bar("yellow", 5))), render_digit(7)):
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            encoded.append(buffer.getvalue())
    assert encoded[:2] == encoded[2:]


def test_dataloader_restricts_to_tasks_in_file_order(dm):
    rows = dm.rows("calibration")
    for tasks in (("digit",), ("chart_tallest", "chart_count"), ("text",), None):
        names = TESTBED_VQA_TASKS if tasks is None else tasks
        ids = [i for batch in dm.dataloader("calibration", tasks=tasks) for i in batch["task_ids"].tolist()]
        assert ids == [TESTBED_VQA_TASKS.index(r["task"]) for r in rows if r["task"] in names]
    assert all(len(b["task_ids"]) <= 4 for b in dm.dataloader("train", tasks="digit"))
    assert sum(len(b["task_ids"]) for b in dm.dataloader("train", tasks="digit")) == 10
    assert torch.equal(next(iter(dm.dataloader("train", tasks="digit")))["input_ids"],
                       next(iter(dm.dataloader("train", tasks="digit")))["input_ids"])  # unshuffled
    with pytest.raises(ValueError, match="unknown testbed VQA task 'digits'"):
        dm.dataloader("val", tasks=["digits"])
    with pytest.raises(ValueError, match="split must be one of"):
        dm.dataloader("test")
    charts = TestbedVQADataModule(dm.processor, root=str(dm.folder.parent.parent), n_train=4, n_val=2, n_selection=0,
                                  n_calibration=0, tasks=("chart_count",), batch_size=4)
    with pytest.raises(ValueError, match="task 'digit' is not one of this datamodule's tasks"):
        charts.dataloader("val", tasks="digit")
    assert charts.dataloader("selection") == [] and charts.selection_dataloader() == []


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "llava_onevision"])
def test_labels_are_only_on_the_answer(dm, family):
    data = dm if family == "qwen3_vl_moe" else TestbedVQADataModule(
        f"tiny:{family}", root=str(dm.folder.parent.parent), batch_size=4, **SIZES)
    assert data.folder == dm.folder and data.task_names == list(TESTBED_VQA_TASKS)
    tokenizer = data.processor.tokenizer
    rows = data.rows("val")
    seen = 0
    for batch in data.val_dataloader():
        assert "pixel_values" in batch
        for b in range(len(batch["input_ids"])):
            labels = batch["labels"][b]
            assert tokenizer.decode(labels[labels != -100]) == rows[seen]["answer"] + END
            assert batch["task_ids"][b].item() == TESTBED_VQA_TASKS.index(rows[seen]["task"])
            seen += 1
    assert seen == len(rows)
    selection = list(data.selection_dataloader())
    assert torch.cat([b["task_ids"] for b in selection]).tolist() == [TESTBED_VQA_TASKS.index(r["task"])
                                                                       for r in data.rows("selection")]


def test_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown testbed VQA task 'colour'"):
        testbed_vqa_splits({"val": 2}, tasks=("digit", "colour"))
    with pytest.raises(ValueError, match=r"image_size must be an int >= 16 \(room for 4 bars with gaps\), got 12"):
        build_testbed_vqa(tmp_path, {"val": 2}, image_size=12)
    with pytest.raises(ValueError, match="image_size must be an int >= 16"):
        render_digit(0, 8)
    with pytest.raises(ValueError, match="the size of split 'train' must be an int >= 0, got -1"):
        testbed_vqa_splits({"train": -1})
    with pytest.raises(ValueError, match="n_calibration must be an int >= 0, got -3"):
        TestbedVQADataModule("tiny:qwen3_vl_moe", root=str(tmp_path), n_calibration=-3)
    with pytest.raises(ValueError, match="n_val must be an int >= 1, got 0"):
        TestbedVQADataModule("tiny:qwen3_vl_moe", root=str(tmp_path), n_val=0)
    with pytest.raises(ValueError, match="1798 'digit' rows, but scikit-learn's load_digits has 1797 images"):
        testbed_vqa_splits({"val": 798, "train": 1000}, tasks=("digit",))
    with pytest.raises(ValueError, match=r"split 'val' holds 5000 'text' rows, but its Python documentation"):
        testbed_vqa_splits({"val": 5000}, tasks=("text",))
    assert not list(tmp_path.iterdir())  # nothing was written


def test_a_canvas_holds_the_picture_once_amid_noise_the_same_every_run(tmp_path):
    """With ``canvas``: the row's own picture, pixel for pixel, at one place of a larger square whose other pixels
    are grey noise in CANVAS_GREY +- CANVAS_NOISE; the same row gets the same canvas, other rows other places; the
    datamodule's folders without a canvas keep their digest (the testbeds trained before the canvas keep theirs)."""
    from lightprune.data.generated.testbed_vqa_datamodule import _params, testbed_vqa_dir
    from lightprune.data.generated.testbed_vqa_pictures import CANVAS_GREY, CANVAS_NOISE, render_row

    rows = testbed_vqa_splits({"val": 12}, seed=0, tasks=("digit", "chart_left", "chart_count"))["val"]
    places = set()
    for row in rows:
        picture = np.asarray(render_row(row, 32))
        canvas = np.asarray(render_row(row, 32, canvas=80))
        assert canvas.shape == (80, 80, 3) and np.array_equal(canvas, np.asarray(render_row(row, 32, canvas=80)))
        found = [(y, x) for y in range(80 - 31) for x in range(80 - 31)
                 if np.array_equal(canvas[y:y + 32, x:x + 32], picture)]
        assert len(found) == 1, row
        y, x = found[0]
        places.add(found[0])
        outside = np.ones((80, 80), dtype=bool)
        outside[y:y + 32, x:x + 32] = False
        noise = canvas[outside]
        assert (noise == noise[:, :1]).all()  # grey: R = G = B
        assert noise.min() >= CANVAS_GREY - CANVAS_NOISE and noise.max() <= CANVAS_GREY + CANVAS_NOISE
        assert noise[:, 0].std() > CANVAS_NOISE / 3  # noise, not a flat colour
    assert len(places) == len(rows)
    for row in rows[:3]:  # centred: the picture at (80 - 32) // 2 on both axes, the same noise around it
        centred = np.asarray(render_row(row, 32, canvas=80, place="centre"))
        assert np.array_equal(centred[24:56, 24:56], np.asarray(render_row(row, 32)))
    with pytest.raises(ValueError, match="canvas_place must be one of \\['random', 'centre'\\], got 'middle'"):
        render_row(rows[0], 32, canvas=80, place="middle")
    assert testbed_vqa_dir(tmp_path, {"train": 4, "val": 4}, canvas=64, canvas_place="centre") != \
        testbed_vqa_dir(tmp_path, {"train": 4, "val": 4}, canvas=64)
    assert render_row(next(r for r in testbed_vqa_splits({"val": 4}, seed=0)["val"] if r.task == "text"),
                      32, canvas=80) is None
    sizes = {"train": 4, "val": 4}
    assert "canvas" not in _params(sizes, 0, TESTBED_VQA_TASKS, 32)
    assert testbed_vqa_dir(tmp_path, sizes) == testbed_vqa_dir(tmp_path, sizes, canvas=None)
    assert testbed_vqa_dir(tmp_path, sizes, canvas=64) != testbed_vqa_dir(tmp_path, sizes)
    for bad in (31, 32.0, True, "64"):
        with pytest.raises(ValueError, match=f"canvas must be None or an int >= image_size \\(32\\), got {bad!r}"):
            render_row(rows[0], 32, canvas=bad)
