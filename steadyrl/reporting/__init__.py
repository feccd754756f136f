"""What a run reports: metrics.jsonl and the run summary, completion logs, quiet third-party messages."""
