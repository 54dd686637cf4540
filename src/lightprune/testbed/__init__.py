"""Testbed models trained here (nothing downloaded): what the default job and the quality tables run on.

Importing this package registers the ``testbed:`` checkpoint source (``testbed:text-<preset>``) with
`lightprune.core.sources.register_source`; the package's entry point makes that happen whenever a
checkpoint name is resolved. May import: data, models, finetune (it trains with MoECausalLM); nothing above.
"""

from lightprune.core.sources import register_source
from lightprune.testbed.text_corpus import DOMAINS, TextCorpus, TextCorpusSpec, build_text_corpus
from lightprune.testbed.text_data import TestbedTextDataModule
from lightprune.testbed.text_moe import (
           TESTBED_PREFIX,
           TEXT_TESTBEDS,
           TextTestbedSpec,
           preset_of,
           resolve_testbed,
           text_testbed,
)

__all__ = ["DOMAINS", "TESTBED_PREFIX", "TEXT_TESTBEDS", "TestbedTextDataModule", "TextCorpus", "TextCorpusSpec",
           "TextTestbedSpec",
           "build_text_corpus", "resolve_testbed", "text_testbed"]

register_source(TESTBED_PREFIX, preset_of, resolve_testbed)
