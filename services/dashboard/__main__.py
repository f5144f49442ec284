import sys

from gearbus.dashboard.server import main

sys.exit(main())
