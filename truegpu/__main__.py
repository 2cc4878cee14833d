import sys

from truegpu.cli import main

sys.exit(main())
