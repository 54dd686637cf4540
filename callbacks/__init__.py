"""Project-local criteria, width scorers and callbacks, named from configs by class_path.

This folder is a worked example of extending lightprune without touching the package: down_proj_norm.py (an expert
criterion, used by configs/custom_criterion.yaml) and weight_norm_width.py (a width scorer for WidthSearch).
"""
