"""Configuration: OnPolicyConfig, its value checks, the batch hierarchy, TRL's names and calls."""
