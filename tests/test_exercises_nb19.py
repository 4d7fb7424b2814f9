"""Tests for labkit/exercises/nb19.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import os

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb19

NAME = "19_atomic_write"


def check(fn) -> dict:
    return lk.exercises.get(NAME).checker(fn)


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb19.atomic_write
    assert check(ex.reference) == {"fsyncs_before_rename": 1, "dir_fsyncs_after_rename": 1}


def test_writing_the_target_in_place_fails() -> None:
    def in_place(path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path, path)

    with pytest.raises(ExerciseFailed, match="old file is gone"):
        check(in_place)


def test_no_rename_at_all_fails() -> None:
    def direct(path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    with pytest.raises(ExerciseFailed, match="never renamed"):
        check(direct)


def test_rename_without_fsync_fails() -> None:
    def no_fsync(path: str, data: bytes) -> None:
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)

    with pytest.raises(ExerciseFailed, match="not fsynced before the rename"):
        check(no_fsync)


def test_forgetting_the_directory_fsync_fails() -> None:
    def no_dir_sync(path: str, data: bytes) -> None:
        with open(path + ".tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    with pytest.raises(ExerciseFailed, match="directory was not fsynced"):
        check(no_dir_sync)


def test_leftover_temporary_file_fails() -> None:
    def copies(path: str, data: bytes) -> None:
        nb19.atomic_write(path + ".tmp2", data)
        nb19.atomic_write(path, data)

    with pytest.raises(ExerciseFailed, match="leftover files"):
        check(copies)


def test_not_attempted_checks_the_reference(capsys) -> None:
    def todo(path: str, data: bytes) -> None:
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out
