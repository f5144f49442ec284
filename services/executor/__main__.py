import sys

from services.executor.executor import main

sys.exit(main())
