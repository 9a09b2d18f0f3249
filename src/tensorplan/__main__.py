from tensorplan.cli import entry

entry()
