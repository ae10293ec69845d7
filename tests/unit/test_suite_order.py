"""The suite's own scheduling: the files `make test` starts first must exist under those names."""

from __future__ import annotations

from tests.conftest import LONGEST_FIRST, TESTS


def test_every_file_scheduled_first_exists_so_a_rename_cannot_drop_it_silently():
    missing = [where for where in LONGEST_FIRST if not (TESTS.parent / where).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are not there: {missing}"
