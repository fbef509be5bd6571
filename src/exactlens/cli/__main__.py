"""python -m exactlens.cli"""

import sys

from exactlens.cli import main

sys.exit(main())
