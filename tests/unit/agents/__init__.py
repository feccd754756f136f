"""Unit tests of steadyrl/agents/."""
