"""What a run reports: printed logs, metrics.jsonl, the completion log, held-out evaluation."""
