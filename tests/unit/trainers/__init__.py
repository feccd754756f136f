"""Unit tests of steadyrl/trainers/."""
