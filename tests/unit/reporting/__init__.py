"""Unit tests of steadyrl/reporting/."""
