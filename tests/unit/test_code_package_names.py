"""Entry names of an uploaded code package: two entries that name one path once
normalized, or a file that is also a directory, are refused at upload (422 naming ``code``)
instead of failing later, at submit, with a 500."""

from __future__ import annotations

import pytest

from fedtune.code_package import check_package, extract
from fedtune.errors import ConfigError
from tests.service.code_fixtures import zip_with


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ({"pkg/a": b"x", "pkg/a/": b""}, "the same path as 'pkg/a'"),
        ({"pkg/x.py": b"1", "pkg/./x.py": b"2"}, "the same path as 'pkg/x.py'"),
        ({"pkg//x.py": b"1", "pkg/x.py": b"2"}, "the same path as 'pkg//x.py'"),
        ({"pkg/a": b"x", "pkg/a/x.py": b"y"}, "'pkg/a' is a file, but 'pkg/a/x.py' lies inside"),
    ],
    ids=["file-and-dir-entry", "dot-part", "double-slash", "file-with-children"],
)
def test_colliding_entries_are_refused_naming_both(entries: dict, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_package(zip_with(entries))
    assert err.value.field == "code" and reason in err.value.reason


def test_an_exact_duplicate_is_still_refused() -> None:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pkg/x.py", b"1")
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("pkg/x.py", b"2")
    with pytest.raises(ConfigError, match="the same entry twice"):
        check_package(buffer.getvalue())


def test_directories_and_their_files_are_fine(tmp_path) -> None:
    data = zip_with({"pkg/": b"", "pkg/sub/": b"", "pkg/sub/x.py": b"x = 1\n", "pkg/y.py": b""})
    assert len(check_package(data)) == 4
    root = extract(data, tmp_path / "code")
    assert (root / "pkg" / "sub" / "x.py").read_text() == "x = 1\n"
