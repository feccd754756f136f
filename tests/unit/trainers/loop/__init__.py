"""Unit tests of steadyrl/trainers/loop/."""
