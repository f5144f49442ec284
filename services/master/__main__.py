import sys

from services.master.master import main

sys.exit(main())
