"""What starts real servers and the testbed around them.

Installed with kvtier so a subcommand that drives a live stack finds deploy/run-stack.sh (shipped as package data)
outside a checkout. run-stack.sh is only its command-line entry: deploy/run_stack.py does the work.
"""

from pathlib import Path

# The scripts travel inside the installed package; this is the one place that names their folder.
SCRIPTS = Path(__file__).resolve().parent
RUN_STACK = SCRIPTS / "run-stack.sh"
