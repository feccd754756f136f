"""Unit tests of steadyrl/checkpoint/."""
