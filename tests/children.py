"""Where the tests start ``python -c`` and ``python -m`` children: in this directory, not the
checkout's root, which Python would put first on their sys.path. So a child imports the
installed library, as the tests and the script children (``first_use_child.py``: its own
directory comes first) do."""
from pathlib import Path

CHILD_CWD = Path(__file__).resolve().parent
