"""Session-wide reporting for the generated suites."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter):
    """Report how many bad-input/layout cases the robustness sweep tried."""
    for name, mod in list(sys.modules.items()):
        if name.endswith("test_robustness") and hasattr(mod, "_COUNT"):
            n = mod._COUNT["cases"]
            if n:
                terminalreporter.write_line(
                    f"robustness sweep: {n} bad-input/layout cases tried over {len(mod.SWEPT)} entry points")
