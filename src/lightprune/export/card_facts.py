"""What an export's manifest and model card say of it beyond its weights: ``save_pruned(card=...)`` checked
(`card_facts`, keys `CARD_KEYS`) and the plan as the manifest records it (`plan_record`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from lightprune.core.checks import check_utf8
from lightprune.experts.plan import ExpertPlan

__all__ = ["CARD_KEYS", "card_facts", "plan_record"]

#: the keys ``save_pruned(card=...)`` accepts
CARD_KEYS = ("plan", "source", "command", "evaluation", "parameters_before", "parameter_bytes_before")


def plan_record(plan: ExpertPlan) -> dict[str, Any]:
    """``plan`` as the manifest records it: its ``to_dict()`` as `ExpertPlan.save` writes it."""
    return json.loads(json.dumps(plan.to_dict(), default=str))


def card_facts(card: Mapping[str, Any] | None, counts: Mapping[int, int]) -> dict[str, Any]:
    """Validate ``save_pruned(card=...)``; returns every `CARD_KEYS` key (``None`` when not given), the plan
    as `plan_record` (an ExpertPlan converted once; a ``to_dict()`` mapping parsed once, which checks it).

    ``counts``: the pruned model's {layer: routed experts}, which the plan's kept counts must equal (a plan of
    another model, or one that leaves out MoE layers, is a ``ValueError``).
    """
    card = dict(card or {})
    unknown = sorted(set(card) - set(CARD_KEYS))
    if unknown:
        raise ValueError(f"card has unknown keys {unknown}; allowed: {list(CARD_KEYS)}")
    facts = {key: card.get(key) for key in CARD_KEYS}
    plan = facts["plan"]
    if plan is not None:
        if isinstance(plan, Mapping):
            plan = ExpertPlan.from_dict(dict(plan))
        if not isinstance(plan, ExpertPlan):
            raise TypeError(f"card['plan'] must be an ExpertPlan or its to_dict(), got {type(plan).__name__}")
        if plan.kept_counts() != dict(counts):
            raise ValueError(f"card['plan'] keeps {plan.kept_counts()} experts per layer, the model has "
                             f"{dict(counts)}: not the plan this model was pruned with")
        facts["plan"] = plan_record(plan)
    for key in ("parameters_before", "parameter_bytes_before"):
        if facts[key] is not None and (isinstance(facts[key], bool) or not isinstance(facts[key], int)):
            raise TypeError(f"card[{key!r}] must be an int, got {facts[key]!r}")
    if facts["evaluation"] is not None:
        if not isinstance(facts["evaluation"], Mapping):
            raise TypeError(f"card['evaluation'] must be a mapping, got {type(facts['evaluation']).__name__}")
        try:
            facts["evaluation"] = json.loads(json.dumps(dict(facts["evaluation"])))
        except (TypeError, ValueError) as err:
            raise TypeError(f"card['evaluation'] must be JSON-serialisable: {err}") from None
    if facts["command"] is not None and not isinstance(facts["command"], str):
        raise TypeError(f"card['command'] must be a string, got {facts['command']!r}")
    if facts["source"] is not None:
        facts["source"] = os.fspath(facts["source"])
    check_utf8({key: value for key, value in facts.items() if key != "plan"}, "the export's manifest and model card "
               "(UTF-8)", path="card")  # the plan checks its own
    return facts
