import sys

from services.dashboard.server import main

sys.exit(main())
