"""Prompts as the model sees them, and the resumable prompt sampler."""
