"""Testbed models trained here (nothing downloaded): what quality tables and the default job run on."""

from .text_corpus import DOMAINS, TextCorpus, TextCorpusSpec, build_text_corpus
from .text_data import TestbedTextDataModule
from .text_moe import TESTBED_PREFIX, TEXT_TESTBEDS, TextTestbedSpec, resolve_testbed, text_testbed

__all__ = ["DOMAINS", "TESTBED_PREFIX", "TEXT_TESTBEDS", "TestbedTextDataModule", "TextCorpus", "TextCorpusSpec",
           "TextTestbedSpec",
           "build_text_corpus", "resolve_testbed", "text_testbed"]
