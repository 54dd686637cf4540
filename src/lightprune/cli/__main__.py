"""``python -m lightprune.cli`` (what ``torchrun ... -m lightprune.cli`` starts on every rank): the LightningCLI."""

from lightprune.cli.app import main

main()
