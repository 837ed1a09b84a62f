"""`--stream ray|rest` (tests/streams.py): every module that holds a Ray or cluster test, whole, in one stream;
every other module in the other; the two together are the suite, each test once. One inner session in this
process (pytester), under this project's own conftest, collecting a suite of three modules."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
SUITE = {
    "test_a": "import pytest\n\n@pytest.mark.ray\ndef test_ray():\n    pass\n\ndef test_plain():\n    pass\n",
    "test_b": "import pytest\n\n@pytest.mark.cluster\ndef test_cluster():\n    pass\n",
    "test_c": "import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n\ndef test_plain():\n    pass\n",
}
RAY = ["test_a.py::test_ray", "test_a.py::test_plain", "test_b.py::test_cluster"]
REST = ["test_c.py::test_slow", "test_c.py::test_plain"]


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makeconftest((HERE / "conftest.py").read_text())
    pytester.makepyfile(**SUITE)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return [line for line in result.outlines if "::" in line]


@pytest.mark.parametrize("args, expected", [(("--stream", "ray"), RAY), (("--stream", "rest"), REST),
                                            ((), RAY + REST)], ids=["ray", "rest", "no-stream"])
def test_each_module_goes_whole_to_one_stream(pytester, args, expected):
    assert collected(pytester, *args) == expected
