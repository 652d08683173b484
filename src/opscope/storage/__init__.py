"""opscope.storage."""
