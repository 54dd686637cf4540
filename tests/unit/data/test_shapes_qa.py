"""Shapes QA: determinism, disjoint splits, answers recomputed from the pictures' pixels, task_ids, label masks."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import deque
from pathlib import Path

import pytest
import torch
from PIL import Image

from lightprune.data import (
    ImageTextJsonlDataModule,
    JsonlRowError,
    ShapesQADataModule,
    shapes_qa_rows,
    shapes_qa_splits,
    shapes_qa_texts,
    tiny_mllm_processor,
)
from lightprune.data.generated.shapes_qa import BACKGROUND, COLORS, SHAPES_QA_TASKS, render_shapes
from lightprune.data.tiny_processor import TINY_CORPUS
from lightprune.finetune import MoECausalLM

SIZES = dict(n_train=30, n_val=20, n_selection=10, n_calibration=10)


@pytest.fixture(scope="module")
def processor():
    return tiny_mllm_processor("qwen2_5_vl", texts=TINY_CORPUS + tuple(shapes_qa_texts()))


@pytest.fixture(scope="module")
def dm(tmp_path_factory, processor):
    return ShapesQADataModule(processor, root=str(tmp_path_factory.mktemp("cache")), batch_size=4, **SIZES)


def _components(image: Image.Image) -> list[dict]:
    """4-connected regions of non-background pixels: colour name, pixel count, bounding box, corners, centre x."""
    width, height = image.size
    pixels = image.load()
    names = {rgb: name for name, rgb in COLORS.items()}
    seen, found = set(), []
    for y0 in range(height):
        for x0 in range(width):
            if (x0, y0) in seen or pixels[x0, y0] == BACKGROUND:
                continue
            colour = pixels[x0, y0]
            region, queue = [], deque([(x0, y0)])
            seen.add((x0, y0))
            while queue:
                x, y = queue.popleft()
                region.append((x, y))
                assert pixels[x, y] == colour, "a shape touches a shape of another colour"
                for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                    if 0 <= nx < width and 0 <= ny < height and (nx, ny) not in seen \
                            and pixels[nx, ny] != BACKGROUND:
                        seen.add((nx, ny))
                        queue.append((nx, ny))
            xs, ys = [p[0] for p in region], [p[1] for p in region]
            box = (min(xs), min(ys), max(xs), max(ys))
            cells = set(region)
            corners = [(box[0], box[1]) in cells, (box[2], box[1]) in cells, (box[0], box[3]) in cells,
                       (box[2], box[3]) in cells]
            # square: every corner of its box; triangle (apex up): the two bottom ones; circle: none
            kind = {(True, True, True, True): "square", (False, False, True, True): "triangle",
                    (False, False, False, False): "circle"}[tuple(corners)]
            found.append({"color": names[colour], "kind": kind, "x": (box[0] + box[2]) / 2})
    return found


def _answer_from_pixels(row: dict, image: Image.Image) -> str:
    shapes = _components(image)
    question = row["messages"][1]["content"]
    if row["task"] == "count":
        return str(len(shapes))
    if row["task"] == "color":
        kind = question.rsplit(" ", 1)[1].rstrip("?")
        return next(s["color"] for s in shapes if s["kind"] == kind)
    if row["task"] == "shape":
        colour = question.split()[4]
        return next(s["kind"] for s in shapes if s["color"] == colour)
    if row["task"] == "position":
        colour = question.split()[2]
        return "left" if next(s["x"] for s in shapes if s["color"] == colour) < image.size[0] / 2 else "right"
    raise AssertionError(row["task"])


def test_rows_are_deterministic_and_seeded():
    a, b = shapes_qa_rows(40, seed=3), shapes_qa_rows(40, seed=3)
    assert a == b and a != shapes_qa_rows(40, seed=4)
    assert [r.task for r in a[:10]] == list(SHAPES_QA_TASKS) * 2
    image_rows = [r for r in a if r.has_image]
    assert all(render_shapes(r.shapes).tobytes() == render_shapes(r.shapes).tobytes() for r in image_rows)
    # a prefix of the stream does not depend on how much is drawn after it
    assert shapes_qa_rows(15, seed=3) == a[:15]
    assert [r.task for r in shapes_qa_rows(6, seed=0, tasks=("text", "count"))] == ["text", "count"] * 3
    with pytest.raises(ValueError, match="'colour'"):
        shapes_qa_rows(2, tasks=("colour",))


def test_cache_is_byte_identical_across_roots_and_reused(tmp_path, processor, dm):
    other = ShapesQADataModule(processor, root=str(tmp_path), batch_size=4, **SIZES)
    assert other.folder.name == dm.folder.name and other.folder != dm.folder
    files = sorted(p.name for p in dm.folder.iterdir())
    assert files == sorted(p.name for p in other.folder.iterdir())
    for name in files:
        assert (dm.folder / name).read_bytes() == (other.folder / name).read_bytes(), name
    assert dm.manifest["rows"] == {"val": 20, "selection": 10, "calibration": 10, "train": 30}
    stamp = (other.folder / "val.jsonl").stat().st_mtime_ns
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid cache is reused silently, not rebuilt
        again = ShapesQADataModule(processor, root=str(tmp_path), batch_size=4, **SIZES)
    assert again.folder == other.folder and (other.folder / "val.jsonl").stat().st_mtime_ns == stamp
    (other.folder / "val-000000.png").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="rebuilding the shapes QA cache"):
        fixed = ShapesQADataModule(processor, root=str(tmp_path), batch_size=4, **SIZES)
    assert (fixed.folder / "val-000000.png").read_bytes() == (dm.folder / "val-000000.png").read_bytes()
    # other parameters, another folder
    assert ShapesQADataModule(processor, root=str(tmp_path), batch_size=4, **{**SIZES, "n_train": 31}).folder \
        != other.folder


def test_splits_are_disjoint(dm):
    seen: dict[str, str] = {}
    for split in ("train", "val", "selection", "calibration"):
        rows = dm.rows(split)
        assert len(rows) == SIZES[f"n_{split}"]
        for row in rows:
            if "image" in row:
                key = hashlib.sha256((dm.folder / row["image"]).read_bytes()).hexdigest()
            else:
                key = row["messages"][1]["content"]
            assert key not in seen, f"{split} repeats a row of {seen.get(key)}"
            seen[key] = split
    assert shapes_qa_splits({"val": 20, "train": 30}) == {"val": shapes_qa_rows(50)[:20],
                                                          "train": shapes_qa_rows(50)[20:]}


def test_answers_match_the_rendered_pixels(dm):
    checked = {task: 0 for task in SHAPES_QA_TASKS}
    for split in ("train", "val"):
        for row in dm.rows(split):
            if row["task"] == "text":
                words = row["messages"][1]["content"].rstrip("?").split(": ")[1].split()
                assert row["answer"] == words[-1] and row["messages"][2]["content"] == row["answer"]
            else:
                with Image.open(dm.folder / row["image"]) as image:
                    assert image.mode == "RGB" and image.size == (32, 32)
                    assert _answer_from_pixels(row, image.convert("RGB")) == row["answer"], row
                    assert len(_components(image.convert("RGB"))) == len(row["shapes"])
            checked[row["task"]] += 1
    assert all(n == 10 for n in checked.values()), checked


def test_batches_carry_task_ids_and_label_only_the_answer(dm, processor):
    assert dm.task_names == list(SHAPES_QA_TASKS)
    rows = dm.rows("val")
    ids, seen = [], 0
    end = "<|im_end|>\n"
    for batch in dm.val_dataloader():
        assert batch["task_ids"].dtype == torch.long and batch["task_ids"].shape == (len(batch["input_ids"]),)
        ids += batch["task_ids"].tolist()
        for b in range(len(batch["input_ids"])):
            labels = batch["labels"][b]
            assert processor.tokenizer.decode(labels[labels != -100]) == rows[seen]["answer"] + end
            seen += 1
    assert ids == [SHAPES_QA_TASKS.index(row["task"]) for row in rows]
    selection = list(dm.selection_dataloader())
    assert sum(len(b["task_ids"]) for b in selection) == 10
    assert torch.cat([b["task_ids"] for b in selection]).tolist() == [SHAPES_QA_TASKS.index(r["task"])
                                                                       for r in dm.rows("selection")]


def test_module_trains_on_shapes_batches(dm):
    module = MoECausalLM(tiny="qwen2_5_vl")
    module.configure_model()
    batch = next(iter(dm.train_dataloader()))
    assert "task_ids" in batch and "pixel_values" in batch
    loss = module.training_step(batch, 0)
    loss.backward()
    assert torch.isfinite(loss)


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_task_field_in_general_rows(tmp_path, processor):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    train = _write(tmp_path / "train.jsonl", [{"messages": chat, "task": "greet"}, {"messages": chat}])
    val = _write(tmp_path / "val.jsonl", [{"messages": chat, "task": "alpha"}])
    dm = ImageTextJsonlDataModule(processor, train=train, val=val, batch_size=2)
    assert dm.task_names == ["alpha", "default", "greet"]
    assert next(iter(dm.calibration_dataloader()))["task_ids"].tolist() == [2, 1]
    assert next(iter(dm.val_dataloader()))["task_ids"].tolist() == [0]
    fixed = ImageTextJsonlDataModule(processor, train=train, batch_size=2, task_names=["greet", "default"])
    assert next(iter(fixed.train_dataloader()))["task_ids"].sort().values.tolist() == [0, 1]
    strict = ImageTextJsonlDataModule(processor, train=train, task_names=["greet"])
    with pytest.raises(ValueError, match=r"train.jsonl:2: task 'default' is not one of task_names \['greet'\]"):
        strict.setup("fit")
    with pytest.raises(ValueError, match="task_names must be distinct"):
        ImageTextJsonlDataModule(processor, train=train, task_names=["a", "a"])
    bad = _write(tmp_path / "bad.jsonl", [{"messages": chat, "task": 3}])
    with pytest.raises(JsonlRowError, match="bad.jsonl:1: 'task' must be a non-empty string, got 3"):
        ImageTextJsonlDataModule(processor, train=bad).setup("fit")


def test_datamodule_checks_its_arguments(tmp_path, processor):
    with pytest.raises(ValueError, match="n_val must be an int >= 1, got 0"):
        ShapesQADataModule(processor, root=str(tmp_path), n_val=0)
    with pytest.raises(ValueError, match="image_size must be an even int >= 24"):
        ShapesQADataModule(processor, root=str(tmp_path), image_size=20)
    none = ShapesQADataModule(processor, root=str(tmp_path), n_train=5, n_val=5, n_selection=0, n_calibration=0)
    assert none.selection_dataloader() == [] and not (none.folder / "selection.jsonl").exists()
    assert len(next(iter(none.calibration_dataloader()))["input_ids"]) == 5  # calibration falls back to train
