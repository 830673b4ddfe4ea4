import sys

from replay.cli import main

# Through the dispatcher, for its error contract (replay/cli.py): `python -m deploy.throttle` is `kvtier throttlefs`.
sys.exit(main(["throttlefs", *sys.argv[1:]]))
