"""Helpers the tests share, imported as ``support.<module>`` (tests/ is on sys.path under pytest).

toy_run.py and crash_fuzz.py are also scripts: ``python tests/support/toy_run.py OUTPUT_DIR ...``.
"""
