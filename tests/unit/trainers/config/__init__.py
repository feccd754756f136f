"""Unit tests of steadyrl/trainers/config/."""
