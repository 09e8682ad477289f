"""Files written whole, and a trial's receipt: its final result kept on disk before it is reported, so that a
trial Tune restarts after a crash (it had finished after Tune's last snapshot) reports its receipt instead of
running twice. No Ray."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pyarrow.fs

from ..stopping import StoreFailure


class JsonFile:
    """One JSON document at a local path or an object-storage URI, written whole: to a temporary file, then
    renamed into place, so a kill in the middle leaves the previous document (or none), never half of one."""

    def __init__(self, uri: str):
        self.path = uri
        self._fs, self._file = pyarrow.fs.FileSystem.from_uri(uri)

    def load(self) -> dict[str, Any] | None:
        """The document, or None when there is none. One that does not parse (written by hand, or cut short
        by a version that wrote in place) raises ValueError naming the file."""
        if self._fs.get_file_info(self._file).type == pyarrow.fs.FileType.NotFound:
            return None
        with self._fs.open_input_stream(self._file) as f:
            text = f.read().decode(errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"{self.path} is not a readable JSON document; remove it") from None

    def save(self, data: dict[str, Any]) -> None:
        self.write(json.dumps(data))

    def write(self, text: str) -> None:
        """The document ``text``, written whole."""
        self._fs.create_dir(self._file.rsplit("/", 1)[0], recursive=True)
        partial = f"{self._file}.{os.getpid()}.partial"
        try:
            with self._fs.open_output_stream(partial) as f:
                f.write(text.encode())
            self._fs.move(partial, self._file)
        except BaseException:  # a full disk, or a kill: no half-written file left behind
            try:
                self._fs.delete_file(partial)
            except OSError:
                pass
            raise


def trial_identity(key: str, params: dict[str, Any]) -> str:
    """A trial's identity: a hash of its trial key and config (24 hex digits). Names its receipt, and marks its
    checkpoints as its own."""
    blob = json.dumps({"key": key, "trial": params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class Receipt(JsonFile):
    """The final result of one trial in ``<storage>/<sweep>/<stage>/receipts/``, named by its identity."""

    def __init__(self, folder: str, key: str, params: dict[str, Any]):
        super().__init__(f"{folder.rstrip('/')}/{trial_identity(key, params)}.json")

    def load(self) -> dict[str, Any] | None:
        """An unreadable receipt is no receipt: the trial runs again."""
        try:
            return super().load()
        except ValueError:
            return None

    def carried(self, result: dict[str, Any]) -> str:
        """The receipt of ``result`` as one text to keep elsewhere (the trial's MLflow run) while the disk
        refuses it: its file name and the very text ``save`` writes; ``restore_receipts`` writes it back."""
        return json.dumps({"file": self.path.rsplit("/", 1)[-1], "text": json.dumps(result)})


def restore_receipts(carried: list[str], folder: str) -> int:
    """Write each ``Receipt.carried`` text of ``carried`` (kept on the MLflow runs of trials that finished
    while the disk was full) back as its receipt in ``folder`` where that receipt is missing or unreadable; how
    many were written. Tune then restarts those trials (its state predates their end), and each reports its
    receipt instead of running again. Raises ``StoreFailure`` when the disk still refuses them."""
    written = 0
    for text in carried:
        receipt = json.loads(text)
        target = JsonFile(f"{folder.rstrip('/')}/{receipt['file']}")
        try:
            if target.load() is not None:
                continue
        except ValueError:  # unreadable: no receipt (``Receipt.load``)
            pass
        try:
            target.write(receipt["text"])
        except OSError as exc:
            raise StoreFailure(f"cannot write the receipts of trials that finished while the disk was full in "
                               f"{folder}: {exc.strerror or exc}; free space, then resume again") from None
        written += 1
    return written
