"""Unit tests of steadyrl/distributed/."""
