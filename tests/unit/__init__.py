"""The unit layer: pure parts (tensor math, state objects, checkpoint files on tmp dirs, config resolution),
no training run, no subprocess, no model download. ``pytest tests/unit`` runs in seconds."""
