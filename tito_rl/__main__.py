"""`python -m tito_rl`: the `tito` command."""

import sys

from tito_rl.main import main

sys.exit(main())
