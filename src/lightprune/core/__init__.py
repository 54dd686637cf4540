"""Leaves every layer may use: errors, strict JSON and YAML (:mod:`.jsonio`, :mod:`.strict_yaml`, their bounds
:mod:`.parse_limits`), batch helpers, argument checks and the values options accept (:mod:`.checks`, :mod:`.choices`),
torch.distributed and ZeRO helpers, optional extras, checkpoint sources, lazy package attributes and the one registry
class (:mod:`.registry`).

May import: nothing of lightprune outside core (each module imports torch only where it must, so the command line
reads :mod:`.choices` and :mod:`.checks` without it).
"""
