"""Local-directory backend: the embedded default. Atomicity from rename and link on one filesystem."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from model_store.backend import Backend


class LocalBackend(Backend):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"model-store key escapes the store root: {key!r}")
        return path

    def _temp_beside(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".tmp-", dir=final.parent)
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
                return False
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

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        search = base if base.is_dir() else base.parent
        if not search.exists():
            return []
        keys = []
        for path in search.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
