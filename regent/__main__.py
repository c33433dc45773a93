"""`python -m regent`: Regent's command line (`python -m app`), under the name a project
of one's own imports. `import regent` has checked that ``app`` is Regent's."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
