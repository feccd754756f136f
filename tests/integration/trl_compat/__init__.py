"""TRL compatibility: TRL's names, configs, call order and scripts on steadyrl, and the version fence."""
