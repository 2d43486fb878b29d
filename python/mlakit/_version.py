"""Version of the Python package; equals the C library's (a test checks it)."""

__version__ = "0.1.0"
