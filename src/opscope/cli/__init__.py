"""Command-line interface: one module per subcommand, each with ``main(argv) -> int``."""
