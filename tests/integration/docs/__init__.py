"""The documentation and the example scripts hold: links, the README's index, the examples run."""
