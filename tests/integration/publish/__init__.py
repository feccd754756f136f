"""The trained actor out of a run: save_model, ``steadyrl export``, pushing to the Hub."""
