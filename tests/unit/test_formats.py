"""Format versions (pigeon.storage.formats): a directory without a FORMAT file is format 1, a newer one is refused
naming both, what is not ours is refused as such, and a cluster speaks its oldest member's format."""

import pytest

from pigeon.storage import formats
from pigeon.testing.simdisk import SimDisk


def test_a_directory_says_its_format_and_a_newer_one_is_refused():
    disk = SimDisk()
    disk.makedirs("/d")
    assert formats.check_data_dir(disk, "/d") == 1, "made before formats were numbered"
    formats.mark_data_dir(disk, "/d")
    assert disk.read_file("/d/FORMAT") == f"pigeon-data {formats.DATA_PLAIN}\n".encode()
    disk.write_durably("/d/FORMAT", f"pigeon-data {formats.DATA + 1}\n".encode())
    formats.mark_data_dir(disk, "/d")  # a format already said is never written over
    with pytest.raises(formats.NewerFormat, match=f"data format {formats.DATA + 1}, written by a newer Pigeon; "
                                                  f"this Pigeon reads formats up to {formats.DATA}"):
        formats.check_data_dir(disk, "/d")
    disk.write_durably("/d/FORMAT", b"kafka 3\n")
    with pytest.raises(ValueError, match="does not name a Pigeon data format"):
        formats.check_data_dir(disk, "/d")


def test_a_directory_becomes_format_2_when_it_first_holds_a_spread_topic(tmp_path):
    """What every older release reads stays format 1 (a downgrade stays possible); the first record of a spread
    topic raises it first, so an older Pigeon refuses the directory instead of taking that record for damage."""
    import asyncio

    from pigeon.broker.resources import Topic
    from pigeon.node.engine import Engine
    from pigeon.ops.config import Config

    async def go(layout: str) -> str:
        data = str(tmp_path / layout)
        engine = Engine(Config(data_dir=data, topic_layout=layout))
        await engine.start()
        try:
            await engine.create_topic(Topic(name="projects/p/topics/wide"))
        finally:
            await engine.stop()
        return (tmp_path / layout / "FORMAT").read_text()

    assert asyncio.run(go("together")) == f"pigeon-data {formats.DATA_PLAIN}\n"
    assert asyncio.run(go("spread")) == f"pigeon-data {formats.DATA_SPREAD}\n" == "pigeon-data 2\n"


def test_a_cluster_speaks_the_format_of_its_oldest_member():
    assert formats.cluster_format([2, 1, 2]) == 1
    assert formats.cluster_format([]) == formats.CLUSTER


def test_a_node_may_be_upgraded_only_while_every_other_is_up_and_every_ledger_whole():
    from pigeon.cli.cluster import upgrade_problems

    def status(states, unowned=0, under=0):
        return {"nodes": [{"node": f"n{i}", "state": s} for i, s in enumerate(states, 1)], "unowned": unowned,
                "ledgers": {"under_replicated": under}}

    assert upgrade_problems(status(["up", "up", "draining"])) == []
    assert upgrade_problems(status(["up", "down", "cut off"], unowned=2, under=5)) == [
        "node n2 is down", "node n3 is cut off", "2 bundles have no owner",
        "5 ledgers are under-replicated (a repair is under way)"]
