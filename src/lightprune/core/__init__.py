"""Leaves every layer may use: errors, strict JSON and YAML (`jsonio`, `strict_yaml`, their bounds
`parse_limits`), batch helpers, argument checks and the values options accept (`checks`, `choices`),
torch.distributed and ZeRO helpers, optional extras, checkpoint sources, lazy package attributes and the one registry
class (`registry`).

May import: nothing of lightprune outside core (each module imports torch only where it must, so the command line
reads `choices` and `checks` without it).
"""
