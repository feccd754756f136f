"""Unit tests of steadyrl/toy/."""
