"""TestbedTextDataModule: the text testbed's corpus and tokenizer as a datamodule (what its configs name).

The corpus of a text testbed preset (`lightprune.testbed.TEXT_TESTBEDS`; prose and code from
Python's documentation and standard library, `lightprune.testbed.text_corpus`) served exactly as
`TextJsonlDataModule` serves JSONL files, with the preset's tokenizer (the one
the testbed model was trained with). ``calibration_domain`` picks the calibration file: the mixed
calibration split or one domain's rows (``prose``, ``code``).
"""

from __future__ import annotations

from lightprune.data.text import TextJsonlDataModule
from lightprune.testbed.text_corpus import build_text_corpus
from lightprune.testbed.text_moe import TEXT_TESTBEDS

__all__ = ["TestbedTextDataModule"]


class TestbedTextDataModule(TextJsonlDataModule):
    """Splits of the text testbed ``preset``'s corpus (built and cached on construction).

    Args:
        preset: a text testbed preset (``micro``, ``small``, ``full``): its corpus and tokenizer.
        root: cache root (``$LIGHTPRUNE_CACHE`` or ``~/.cache/lightprune`` by default).
        max_length: tokens kept per row (default: the preset's training length).
        batch_size, num_samples, seed, num_workers: as in TextJsonlDataModule.
        mask_prompt: labels only on completions (the corpus rows are plain text, so every token counts either way).
        calibration_domain: ``None`` (the mixed calibration split), ``"prose"`` or ``"code"``.
    """

    __test__ = False  # not a pytest class, despite its name

    def __init__(self, preset: str = "small", root: str | None = None, *, max_length: int | None = None,
                 batch_size: int = 8, num_samples: int | None = None, seed: int = 0, num_workers: int = 0,
                 mask_prompt: bool = False, calibration_domain: str | None = None):
        if preset not in TEXT_TESTBEDS:
            raise ValueError(f"preset must be one of {list(TEXT_TESTBEDS)}, got {preset!r}")
        spec = TEXT_TESTBEDS[preset]
        self.corpus = build_text_corpus(spec.corpus, root)
        super().__init__(**self.corpus.jsonl_args(calibration_domain),
                         max_length=spec.max_length if max_length is None else max_length, batch_size=batch_size,
                         mask_prompt=mask_prompt, add_eos=True, num_samples=num_samples, seed=seed,
                         num_workers=num_workers)
        self.preset = preset
