"""One line per failure (tasks/errors.py): what a user reads when a run stops."""
import pytest

from tasks.errors import one_line

# What Ray Client raises when the head's proxy cannot start or reach the client's server: a header, then the
# proxy's traceback (ray/util/client/server/proxier.py). The first line alone said nothing (CI, Dec 2026).
RAY_CLIENT_INIT = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File "proxier.py", line 778, in Datapath\n    raise RuntimeError(\n'
    "RuntimeError: Proxy failed to Connect to backend! Check `ray_client_server.err`\n")


@pytest.mark.parametrize("exc, line", [
    (ValueError("bad value\nmore detail"), "bad value"),
    (RAY_CLIENT_INIT,
     "Initialization failure from server: RuntimeError: Proxy failed to Connect to backend! "
     "Check `ray_client_server.err`"),
    (ValueError("\x1b[31mred\x1b[0m"), "red"),
    (ValueError("   "), "ValueError"),
    (ValueError("just a colon:"), "just a colon:"),
    (None, "unknown failure"),
])
def test_one_line(exc, line):
    assert one_line(exc) == line
