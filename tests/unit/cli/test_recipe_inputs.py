"""lp.run_recipe's refusals of what is no recipe or no overrides: YAML text given as the recipe, a list as overrides,
a recipe without callbacks; a callback's options given as a mapping under its address are spelled out."""

from __future__ import annotations

import pytest
from fixtures import REPO

from lightprune.cli.options import OptionError
from lightprune.cli.recipe import _flattened, run_recipe


def test_yaml_text_as_the_recipe_is_refused_clipped() -> None:
    text = "trainer:\n  default_root_dir: /tmp/x\nmodel:\n  class_path: lightprune.finetune.MoECausalLM\n" * 50
    with pytest.raises(FileNotFoundError) as info:
        run_recipe(text)
    assert str(info.value) == (f"recipe {text[:57]!r}... is no file's name but text: a recipe is a config file's "
                               "path, or its content as a mapping (yaml.safe_load the text first)")


def test_a_missing_recipe_file_is_named() -> None:
    with pytest.raises(FileNotFoundError) as info:
        run_recipe("configs/nope.yaml")
    assert str(info.value) == ("recipe 'configs/nope.yaml' does not exist (a recipe is a config file's path, or its "
                               "content as a mapping)")


def test_overrides_that_are_no_mapping_are_refused() -> None:
    with pytest.raises(TypeError) as info:
        run_recipe(str(REPO / "configs" / "aimer_tiny.yaml"), overrides=["prune.ratio", 0.25])
    assert str(info.value) == ("overrides is a mapping of option names to values ({'prune.ratio': 0.25}), got a list: "
                               '["prune.ratio", 0.25]')


def test_a_callbacks_options_as_a_mapping_are_spelled_out() -> None:
    assert _flattened({"prune": {"ratio": 0.25, "criterion": {"class_path": "x"}}, "trainer.max_steps": 3,
                       "data": {"class_path": "y"}}) == {"prune.ratio": 0.25, "prune.criterion": {"class_path": "x"},
                                                         "trainer.max_steps": 3, "data": {"class_path": "y"}}
    with pytest.raises(OptionError) as info:  # checked as the command checks them, under their dotted names
        run_recipe(str(REPO / "configs" / "aimer_tiny.yaml"), overrides={"prune": {"ratioo": 0.25}})
    assert str(info.value).startswith("--prune.ratioo: ExpertPruning has no option 'ratioo' (did you mean 'ratio'?)")


@pytest.mark.parametrize("command", ["export", "calibrate"])
def test_a_recipe_without_callbacks_is_refused(tmp_path, command) -> None:
    recipe = {"model": {"class_path": "lightprune.finetune.MoECausalLM",
                        "init_args": {"checkpoint": "testbed:text-small"}},
              "trainer": {"default_root_dir": str(tmp_path / "run")}}
    with pytest.raises(OptionError) as info:
        run_recipe(recipe, command)
    assert str(info.value) == ("the recipe has no callbacks (trainer.callbacks): nothing would be pruned or written "
                               f"by `{command}`; list them (ExpertPruning and Export, for example: see "
                               "configs/aimer_tiny.yaml)")
    assert not (tmp_path / "run").exists()
