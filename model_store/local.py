"""Local-directory backend: the embedded default. Atomicity from rename and link on one filesystem."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from model_store.backend import Backend, ObjectInfo

_TEMP_PREFIX = ".tmp-"


class LocalBackend(Backend):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"file://{self.root}"

    def locate(self, key: str) -> str:
        return f"file://{self._path(key)}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"model-store key escapes the store root: {key!r}")
        return path

    def _temp_beside(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=final.parent)
        os.close(fd)
        return Path(name)

    def put_file(self, key: str, path: Path) -> None:
        final = self._path(key)
        tmp = self._temp_beside(final)
        try:
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, length=4 * 1024 * 1024)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> bool:
        final = self._path(key)
        tmp = self._temp_beside(final)
        try:
            with open(tmp, "wb") as dst:
                dst.write(data)
                dst.flush()
                os.fsync(dst.fileno())
            if not exclusive:
                os.replace(tmp, final)
                return True
            try:
                os.link(tmp, final)  # fails if final exists: create-if-absent, atomically
            except FileExistsError:
                return final.read_bytes() == data
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        path = self._path(key)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        except FileNotFoundError as exc:
            raise KeyError(key) from exc
        with f:
            while chunk := f.read(chunk_size):
                yield chunk

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise KeyError(key) from exc

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(
            key=key, size=st.st_size, modified=datetime.fromtimestamp(st.st_mtime, UTC)
        )

    def list_objects(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix) if prefix else self.root
        search = base if base.is_dir() else base.parent
        if not search.exists():
            return []
        found = []
        for path in search.rglob("*"):
            if path.name.startswith(_TEMP_PREFIX) or not path.is_file():
                continue
            key = path.relative_to(self.root).as_posix()
            if key.startswith(prefix) and (info := self.stat(key)) is not None:
                found.append(info)
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def clean_incomplete_uploads(self, older_than: datetime, *, dry_run: bool = False) -> list[str]:
        # A writer that died between mkstemp and rename leaves a temp file; a live one keeps
        # touching its file, so only old ones are abandoned.
        removed = []
        for path in sorted(self.root.rglob(f"{_TEMP_PREFIX}*")):
            try:
                modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            except FileNotFoundError:
                continue  # finished (renamed) while we looked
            if modified < older_than:
                removed.append(path.relative_to(self.root).as_posix())
                if not dry_run:
                    path.unlink(missing_ok=True)
        return removed
