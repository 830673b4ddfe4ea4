"""`kvtier bench --prefix-model chained`: sessions' KV as chains of blocks over the real tiered
store, in rounds. A CPU tier smaller than the working set with no room below it collapses the hit rate (LRU takes
every session's chain head); a disk tier below keeps it at the ideal. Real tiers, real files, a 256 B/token model so a
run takes seconds."""

import json

import pytest
from bench_helpers import chained_run

from replay.outputs import write_plots
from replay.synthetic.cli import main

NO_ROOM_BELOW_GB = 0.000001  # a disk tier smaller than one block: no tier below the CPU (build_tiers always has one)


@pytest.mark.slow
def test_cliff_without_a_tier_below_and_none_with_disk(tmp_path):
    dram = chained_run(tmp_path / "a", storage_capacity_gb=NO_ROOM_BELOW_GB)
    tiered = chained_run(tmp_path / "b")
    for doc in (dram, tiered):
        rows = doc["rounds"]
        assert [r["round"] for r in rows] == list(range(1, 10)) and all(r["completed"] == 8 for r in rows)
        # before the working set crosses the CPU tier both reach the ideal: 2/3, 4/5 of each prompt
        assert [r["hit_rate"] for r in rows[:3]] == [0.0, pytest.approx(2 / 3), pytest.approx(0.8)], rows[:3]
        assert all(r["ideal_hit_rate"] > 0.9 for r in rows[6:])
    late = dram["rounds"][6:]
    tlate = tiered["rounds"][6:]
    assert all(r["hit_rate"] < 0.25 * r["ideal_hit_rate"] for r in late), [r["hit_rate"] for r in dram["rounds"]]
    for r in tiered["rounds"]:
        assert r["hit_rate"] >= r["ideal_hit_rate"] - 0.03, r
    # the tiered run's late hits come in good part from the disk tier, where LRU demoted the chain heads
    by_tier = [r["hit_tokens_by_tier"] for r in tiered["rounds"][6:]]
    assert all(t.get("disk", 0) > 0 for t in by_tier), by_tier
    assert sum(t.get("disk", 0) for t in by_tier) > 0.4 * sum(sum(t.values()) for t in by_tier), by_tier
    # a miss recomputes the whole prompt and rewrites it: late rounds write several times what the tiered run writes
    assert all(a["kv_written_bytes"] > 3 * b["kv_written_bytes"] for a, b in zip(late, tiered["rounds"][6:]))
    assert all(a["recomputed_tokens_per_request"] > 10 * 256 for a in late)
    # replay's per-round figures: the whole reusable prefix recomputed without room below, none of it with the disk
    assert all(a["excess_recompute_share"] > 0.75 and b["excess_recompute_share"] == 0 for a, b in zip(late, tlate))
    assert all(b["kv_bytes_by_tier"]["disk"]["read"] > 0 and b["hit_to_ideal"] == 1.0 for b in tlate)
    # the per-round figure of kvtier replay, drawn from the bench's rows (measured, ideal, kvtier plan's prediction)
    (png,) = write_plots(dram, tmp_path / "plots", figures=("rounds.png",))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # kvtier plan's model of the same sessions and tiers (served one after another) predicts the same: collapsed
    # late rounds without room below, the ideal with the disk tier. Where they part (the crossing round: concurrent
    # requests look their chains up before any of them writes) is not asserted.
    assert all(r["predicted_hit_rate"] < 0.25 * r["ideal_hit_rate"] for r in late)
    assert all(r["predicted_hit_rate"] == pytest.approx(r["ideal_hit_rate"]) for r in tiered["rounds"])


def test_chained_with_the_reference_request_model_is_a_usage_error(tmp_path, capsys):
    from bench_helpers import write_config

    path = write_config(tmp_path, prefix_model="chained")
    assert main(["--config", path, "--request-model", "reference"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvtier bench: ") and "--request-model reference" in err[0]
    assert not (tmp_path / "out.json").exists()
    # a block that fits no tier (200,000 tokens x 2,048 B over 0.95 x 0.2 GB of disk): refused before the run
    assert main(["--config", path, "--block-size", "200000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--block-size 200000: one block" in err[0] and "fits no tier" in err[0]
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_per_round_table_is_printed(tmp_path, capsys):
    doc = chained_run(tmp_path, rounds=2, num_users=2, storage_capacity_gb=0.01)
    out = capsys.readouterr().out
    assert "per round (chained prefix)" in out
    assert json.loads((tmp_path / "out.json").read_text())["block_size"] == 256
    assert doc["rounds"][1]["ideal_hit_rate"] == pytest.approx(2 / 3)
    # the progress view's samples (and the timeline) carry the round and the last whole round's hit rate
    assert doc["timeline"][-1]["round"] == 2 and doc["timeline"][-1]["last_round"]["round"] == 2
