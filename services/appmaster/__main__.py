import sys

from services.appmaster.appmaster import main

sys.exit(main())
