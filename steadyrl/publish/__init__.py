"""How the actor leaves a run: save_model, the Hub, export of a checkpoint."""
