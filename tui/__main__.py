import sys

from tui.launcher import main

sys.exit(main())
