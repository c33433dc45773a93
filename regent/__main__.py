"""`python -m regent`: Regent's command line (`python -m app`), under the name a project
of one's own imports. `import regent` has checked that ``app`` is Regent's."""

import os
import sys

from app.__main__ import main
from app.invocation import COMMAND_VARIABLE

if __name__ == "__main__":
    # Inherited by the server workers it spawns: their hints name this command too.
    os.environ[COMMAND_VARIABLE] = "python -m regent"
    sys.exit(main())
