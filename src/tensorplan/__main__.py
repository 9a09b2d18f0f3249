import sys

from tensorplan.cli import main

sys.exit(main())
