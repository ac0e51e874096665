"""Make `coordinator` resolve to the package, not to this test folder of the same name.

pytest puts tests/ on sys.path (rootdir import mode), where `coordinator/` is a
namespace-package candidate that would shadow the editable install. The lasting fix is
`pythonpath = ["."]` in [tool.pytest.ini_options] (asked of the lead).
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
for name in [m for m in sys.modules if m == "coordinator" or m.startswith("coordinator.")]:
    if getattr(sys.modules[name], "__file__", None) is None:
        del sys.modules[name]
