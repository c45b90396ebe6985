"""``layout.failed_save``: the one line a failed checkpoint write becomes (the e2e full-disk row of
``tests/e2e/test_faults.py`` runs it for real on a size-limited tmpfs)."""

from __future__ import annotations

import errno

from hpcppo.errors import StorageError
from hpcppo.rundir import checkpoints as layout


class _LikeDcpFailure(BaseException):
    """Shaped like torch's CheckpointException: a BaseException holding each failed rank's exception."""

    def __init__(self, failures):
        super().__init__("CheckpointException ranks:" + ",".join(map(str, failures)))
        self.failures = failures


def _committed(root, step, size=1000):
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    (d / "shard.bin").write_bytes(b"x" * size)
    (d / layout.MARKER).write_text("{}")


def test_no_space_is_found_in_a_rank_failure_and_the_partial_write_goes(tmp_path):
    root = tmp_path / "run-1" / "checkpoints"
    _committed(root, 3)
    partial = root / "step-6.tmp-ab12"
    partial.mkdir()
    (partial / "half").write_bytes(b"y")
    exc = _LikeDcpFailure({1: OSError(errno.ENOSPC, "No space left on device")})
    err = layout.failed_save(root, 6, exc, remove=True)
    assert isinstance(err, StorageError)
    text = str(err)
    assert "\n" not in text and str(root) in text and "no space left" in text
    assert "checkpoint step 3 is intact" in text and "the partial write was removed" in text
    assert "hpcppo resume run-1" in text
    assert not partial.exists() and (root / "step-3").exists()


def test_other_ranks_leave_the_partial_write_to_rank_0(tmp_path):
    root = tmp_path / "checkpoints"
    partial = root / "step-2.tmp-ab12"
    partial.mkdir(parents=True)
    err = layout.failed_save(root, 2, OSError(errno.EDQUOT, "Disk quota exceeded"), remove=False)
    assert "no space left" in str(err) and "no checkpoint is committed yet" in str(err)
    assert partial.exists()


def test_read_only_and_unknown_failures_say_what_they_are(tmp_path):
    root = tmp_path / "checkpoints"
    _committed(root, 1)
    try:
        raise RuntimeError("write failed") from OSError(errno.EROFS, "Read-only file system")
    except RuntimeError as e:
        ro = layout.failed_save(root, 2, e, remove=True)
    assert "read-only or the directory is not writable" in str(ro)
    other = layout.failed_save(root, 2, ValueError("bad\nstate dict key"), remove=True)
    assert "ValueError: state dict key" in str(other) and "\n" not in str(other)
