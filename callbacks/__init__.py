"""Project-local criteria and callbacks, named from configs by class_path.

This folder is a worked example of extending lightprune without touching the package; see
down_proj_norm.py and configs/custom_criterion.yaml.
"""
