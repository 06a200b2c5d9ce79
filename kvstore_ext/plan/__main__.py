"""``python -m kvstore_ext.plan``: see :mod:`kvstore_ext.plan.cli`."""
import sys

from .cli import main

sys.argv[0] = "python -m kvstore_ext.plan"   # as the results' JSON records the command
sys.exit(main())
