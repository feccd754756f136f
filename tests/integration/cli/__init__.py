"""The ``steadyrl`` command line."""
