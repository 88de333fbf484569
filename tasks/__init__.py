"""Thin entry points: parse arguments, build from the library, print. Each has ``main(argv=None)``."""
