"""Checkpoints and resume: exact resume after a kill, cadence, the manifest, the run directory, the fingerprint,
reliability."""
