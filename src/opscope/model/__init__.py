"""opscope.model."""
