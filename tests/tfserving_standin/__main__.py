"""``python -m tests.tfserving_standin``: the test stand-in for tensorflow_model_server."""

import sys

from tests.tfserving_standin.server import main

sys.exit(main())
