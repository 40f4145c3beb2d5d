import sys

from leasekeeper.cli import main

sys.exit(main())
