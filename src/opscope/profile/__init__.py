"""opscope.profile."""
