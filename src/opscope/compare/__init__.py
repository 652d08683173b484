"""opscope.compare."""
