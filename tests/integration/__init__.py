"""The run-level suites, one folder per capability: trainers built and trained on the toy or real models, processes
launched with accelerate, vLLM servers, the docs' examples. The unit layer is tests/unit."""
