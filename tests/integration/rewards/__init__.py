"""Reward functions and reward models as TRL's."""
