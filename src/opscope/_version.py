"""The version of opscope, in a module of its own so that any layer can read it without
importing the public API in ``opscope/__init__.py``."""

__version__ = "0.1.0"
