"""opscope.capture.torch."""
