"""`python -m webhook.cli`: the same as the `gpuadm` command."""

import sys

from webhook.cli import main

sys.exit(main())
