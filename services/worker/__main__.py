import sys

from services.worker.worker import main

sys.exit(main())
