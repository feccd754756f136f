"""The package's version, in a module of its own: setup.cfg reads it without importing the package, and publish/ without
importing the package's root (which imports the trainers)."""

__version__ = "0.1.0"
