"""Unit tests of steadyrl/generation/."""
