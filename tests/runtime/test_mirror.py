"""A worker's copy of the run directory (cluster.shared_dir=false): what grows in it reaches the run directory byte
for byte, a rotated file starts again, a checkpoint part goes whole, paths are moved between the two, and a piece
cannot land outside the run directory's records, spans, logs and checkpoints."""

from __future__ import annotations

import pytest

from areal.runtime.storage.mirror import PIECE_BYTES, Mirror, Piece, leftovers, write


def _ship(mirror: Mirror, home) -> None:
    for piece in mirror.changes():
        write(home, piece)


def test_what_grows_in_the_copy_reaches_the_run_directory_byte_for_byte(tmp_path):
    local, home = tmp_path / "copy", tmp_path / "run"
    (local / "samples").mkdir(parents=True)
    (local / "logs").mkdir()
    home.mkdir()
    mirror = Mirror(local, home, "rollout[0]")
    (local / "samples" / "rollout-0.jsonl").write_text('{"sample_id": 0}\n')
    (local / "logs" / "rollout-0.log").write_bytes(b"x" * (PIECE_BYTES + 10))  # two pieces
    pieces = mirror.changes()
    assert [(p.path, len(p.data), p.fresh) for p in pieces] == [
        ("logs/rollout-0.log", PIECE_BYTES, False), ("logs/rollout-0.log", 10, False),
        ("samples/rollout-0.jsonl", 17, False)]
    for piece in pieces:
        write(home, piece)
    with (local / "samples" / "rollout-0.jsonl").open("a") as out:
        out.write('{"sample_id": 1}\n')
    assert [(p.path, p.data) for p in mirror.changes()] == [("samples/rollout-0.jsonl", b'{"sample_id": 1}\n')]
    assert mirror.changes() == []
    assert (home / "samples" / "rollout-0.jsonl").read_text() == '{"sample_id": 0}\n'  # the last piece not written
    _ship(mirror, home)


def test_a_rotated_span_file_starts_again_and_the_older_half_arrives_whole(tmp_path):
    local, home = tmp_path / "copy", tmp_path / "run"
    (local / "spans").mkdir(parents=True)
    home.mkdir()
    mirror = Mirror(local, home, "actor[0]")
    current = local / "spans" / "actor-0.jsonl"
    current.write_text("a\nb\n")
    _ship(mirror, home)
    current.replace(local / "spans" / "actor-0.old.jsonl")  # what spans.py does at its size limit
    current.write_text("c\n")
    _ship(mirror, home)
    assert (home / "spans" / "actor-0.jsonl").read_text() == "c\n"
    assert (home / "spans" / "actor-0.old.jsonl").read_text() == "a\nb\n"


def test_a_mirror_sends_its_own_workers_files_and_appends_to_what_a_predecessor_sent(tmp_path):
    local, home = tmp_path / "copy", tmp_path / "run"
    (local / "logs").mkdir(parents=True)
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "rollout-1.log").write_text("the replica before, on another node\n")
    (local / "logs" / "rollout-1.log").write_text("this one\n")
    (local / "logs" / "rollout-10.log").write_text("another worker of this node\n")
    (local / "logs" / "score-1.log").write_text("another worker of this node\n")
    _ship(Mirror(local, home, "rollout[1]"), home)
    assert (home / "logs" / "rollout-1.log").read_text() == "the replica before, on another node\nthis one\n"
    assert sorted(p.name for p in (home / "logs").iterdir()) == ["rollout-1.log"]
    assert [p.name for p in leftovers(local, "rollout-1")] == ["rollout-1.log"]


def test_a_checkpoint_part_is_sent_whole_and_paths_move_between_the_copy_and_the_run_directory(tmp_path):
    local, home = tmp_path / "copy", tmp_path / "run"
    staged = local / "checkpoints" / ".staging-v3" / "trainer-actor"
    staged.mkdir(parents=True)
    (staged / "optimizer.pt").write_bytes(b"\x00" * 5)
    mirror = Mirror(local, home, "rollout[0]")
    pieces = list(mirror.tree(local / "checkpoints" / ".staging-v3"))
    assert pieces == [Piece("checkpoints/.staging-v3/trainer-actor/optimizer.pt", b"\x00" * 5, True)]
    for piece in pieces:
        write(home, piece)
    assert (home / "checkpoints" / ".staging-v3" / "trainer-actor" / "optimizer.pt").read_bytes() == b"\x00" * 5
    assert mirror.homeward(local / "checkpoints" / ".staging-v3") == str(home / "checkpoints" / ".staging-v3")
    command = {"type": "stop", "checkpoint": str(home / "checkpoints" / ".staging-v4"),
               "update": {"via": {"where": str(home) + "-other/x"}}, "ids": [1, 2]}
    assert mirror.localised(command) == {"type": "stop", "checkpoint": str(local / "checkpoints" / ".staging-v4"),
                                         "update": {"via": {"where": str(home) + "-other/x"}}, "ids": [1, 2]}


@pytest.mark.parametrize("path", ["../escape.txt", "weights/actor/v1.safetensors", "plan.json", "/etc/passwd",
                                  "samples/../../escape.txt"])
def test_a_piece_outside_the_records_spans_logs_and_checkpoints_is_refused(tmp_path, path):
    with pytest.raises(ValueError, match="a mirrored file must lie in the run directory's samples, spans, logs, "
                                         "checkpoints"):
        write(tmp_path, Piece(path, b"x", True))
    assert list(tmp_path.iterdir()) == []
