"""opscope.report."""
