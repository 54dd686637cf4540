"""``--print_config`` prints the config the run would use, the addressed options (``--prune.ratio 0.25``) included,
and each subcommand's ``--help`` lists those options."""

from __future__ import annotations

import sys

import pytest
import yaml
from fixtures import REPO

from lightprune.callbacks.options import OPTIONS
from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import ADDRESSES, SUBCOMMANDS

TINY = REPO / "configs" / "aimer_tiny.yaml"
#: one option of every address, and its value as the printed config holds it
SET = {"stats": ("save_every_n_batches", "3", 3), "router_delta": ("holdout_batches", "2", 2),
       "prune": ("ratio", "0.25", 0.25), "export": ("overwrite", "true", True), "width_search": ("align", "32", 32),
       "width_export": ("align", "16", 16), "evaluate": ("max_batches", "7", 7),
       "report": ("output_dir", "report_here", "report_here")}


def _print(argv: list[str], monkeypatch, capsys) -> str:
    from lightprune.cli import app

    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    with pytest.raises(SystemExit) as info:
        app.main()
    out, err = capsys.readouterr()
    assert info.value.code in (0, None), err
    return out


def _callbacks(printed: str, key: str | None = None) -> dict[str, dict]:
    config = yaml.safe_load(printed)
    config = config[key] if key else config
    return {entry["class_path"].rsplit(".", 1)[-1]: entry.get("init_args", {})
            for entry in config["trainer"]["callbacks"]}


def test_print_config_holds_every_addressed_option_and_reruns_the_same_job(tmp_path, monkeypatch, capsys) -> None:
    assert set(SET) == set(ADDRESSES)
    added = [f"--trainer.callbacks+={name}" for name in OPTIONS if name not in ("Export", "ExpertPruning")]
    addressed = [arg for address, (option, text, _) in SET.items() for arg in (f"--{address}.{option}", text)]
    job = ["export", "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path / "run"), *added]
    printed = _print([*job, *addressed, "--print_config"], monkeypatch, capsys)
    callbacks = _callbacks(printed)
    for address, (option, _, value) in SET.items():
        assert callbacks[ADDRESSES[address]][option] == value, address
    assert _callbacks(_print([*job, "--print_config"], monkeypatch, capsys))["ExpertPruning"]["ratio"] == 0.5
    # the printed config, run again: the same callbacks' options, in the first pass and the parser
    saved = tmp_path / "P.yaml"
    saved.write_text(printed)
    check_command_line(["export", "--config", str(saved)])
    assert _callbacks(_print(["export", "--config", str(saved), "--print_config"], monkeypatch, capsys)) == callbacks
    # the option given before the subcommand's --print_config, or --print_config before the subcommand
    again = _print(["--print_config", "export", "--config", str(TINY), "--prune.ratio", "0.3"], monkeypatch, capsys)
    assert _callbacks(again, "export")["ExpertPruning"]["ratio"] == 0.3


def test_print_config_refuses_an_address_of_a_callback_the_job_lacks(tmp_path, monkeypatch, capsys) -> None:
    from lightprune.cli import app

    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--config", str(TINY), "--stats.resume", "true",
                                      "--print_config"])
    with pytest.raises(SystemExit) as info:
        app.main()
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert err == ("lightprune: error: --stats.resume: the job has no ExpertStats callback (add one: "
                   "--trainer.callbacks+=lightprune.callbacks.ExpertStats)\n")


def test_each_subcommands_help_lists_the_addresses_their_callbacks_and_options(monkeypatch, capsys) -> None:
    from lightprune.cli import command

    for subcommand in SUBCOMMANDS:
        monkeypatch.setattr(sys, "argv", ["lightprune", subcommand, "--help"])
        with pytest.raises(SystemExit) as info:
            command.main()
        out = capsys.readouterr().out
        assert info.value.code in (0, None)
        section = out[out.index("lightprune's callback options (--ADDRESS.OPTION VALUE"):]
        for name, spec in OPTIONS.items():
            assert f"  --{spec.address}.* " in section and f" {name}: {spec.summary}" in section, (subcommand, name)
            for argument in spec.arguments:
                assert f"--{spec.address}.{argument}," in section or f"--{spec.address}.{argument}\n" in section
