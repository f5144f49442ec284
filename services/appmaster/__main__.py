import sys

from services.apptypes import run

sys.exit(run("appmaster"))
