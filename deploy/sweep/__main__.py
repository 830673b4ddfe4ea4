import sys

from replay.cli import main

# Through the dispatcher, for its error contract (replay/cli.py): `python -m deploy.sweep` is `kvtier sweep`.
sys.exit(main(["sweep", *sys.argv[1:]]))
