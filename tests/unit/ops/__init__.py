"""Unit tests of steadyrl/ops/."""
