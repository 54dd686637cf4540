"""Calibration statistics: every calibration criterion for every token subset, from one observed pass."""

from .result import CRITERIA, NEGATED, SUBSETS, CalibrationStats

__all__ = ["CalibrationStats", "CRITERIA", "SUBSETS", "NEGATED"]
