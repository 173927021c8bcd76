"""A move into archive/ or failed/ cut short by kill -9 between its link and its unlink is
finished, not made twice, when it is done again."""

from __future__ import annotations

import os

from batchgrader import fsio


def test_a_move_cut_short_after_its_link_is_finished_without_a_second_copy(tmp_path):
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / "a.csv").write_text("an older file of the same name")
    src = tmp_path / "work" / "a.csv"
    src.parent.mkdir()
    src.write_text("the input")
    os.link(src, folder / "a_S1.csv")  # what a kill between link and unlink leaves
    dest = fsio.move_no_clobber(src, folder, "a.csv", "S2")
    assert dest == folder / "a_S1.csv" and dest.read_text() == "the input"
    assert not src.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["a.csv", "a_S1.csv"]


def test_a_file_with_another_name_elsewhere_is_moved_as_usual(tmp_path):
    folder = tmp_path / "archive"
    src = tmp_path / "in.csv"
    src.write_text("x")
    os.link(src, tmp_path / "elsewhere.csv")  # a hard link outside the folder: not a move cut short
    dest = fsio.move_no_clobber(src, folder, "in.csv", "S")
    assert dest == folder / "in.csv" and dest.read_text() == "x" and not src.exists()
    assert (tmp_path / "elsewhere.csv").exists()
