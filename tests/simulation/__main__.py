"""``python -m tests.simulation``: run seeds of the pod simulation (see ``tests.simulation.run``)."""

import sys

from tests.simulation.run import main

sys.exit(main())
