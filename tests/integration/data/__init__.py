"""Datasets in runs: streaming, conversational, the embedded chat fixture."""
