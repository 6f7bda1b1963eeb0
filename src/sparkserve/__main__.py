import sys

from sparkserve.cli import main

sys.exit(main())
