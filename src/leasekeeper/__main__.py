import sys

from leasekeeper.command.cli import main

sys.exit(main())
