"""pytest imports test files by their base name (no packages under tests/): two files of one name
in different folders stop the whole collection ('import file mismatch'), so no name may repeat."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
