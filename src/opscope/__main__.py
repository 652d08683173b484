from opscope.cli.main import entry

entry()
