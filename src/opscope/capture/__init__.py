"""opscope.capture."""
