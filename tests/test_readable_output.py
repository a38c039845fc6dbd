"""Output a person reads: bench plots (axes that span the data, legends beside the points, a
colour per series, the step in the title), the bench table (only what ran), inspect and pack
summaries (sizes in binary units, plurals, file names without a doubled word), and notes
without a doubled ``; ;``. The plots are checked on the matplotlib Figures the bench really
saved (captured at ``savefig``), not on pixels."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from shardkit.humanize import count_text, size_text


# ------------------------------------------------------------------------------ humanize

@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (522240, "510 KiB"), (100034560, "95.4 MiB"), (1023 * 1024, "1.00 MiB"),
    (3 * 2**30, "3.00 GiB"), (2**40, "1.00 TiB"), (5 * 2**60, "5120 PiB")])
def test_size_text_gives_binary_units_with_three_digits(n, text):
    assert size_text(n) == text


def test_size_text_refuses_a_negative_size_and_count_text_pluralises():
    with pytest.raises(ValueError, match="-1"):
        size_text(-1)
    assert [count_text(n, "shard") for n in (0, 1, 2, 1839)] == [
        "0 shards", "1 shard", "2 shards", "1,839 shards"]
    assert count_text(2, "child", "children") == "2 children"


# ------------------------------------------------------------------------------ bench

def _bench(data, out, monkeypatch, **kwargs):
    """A real ``run_bench`` (thread and process backends, persistent workers off and on, batch
    8 at 32 px, 1 warm-up + 2 timed batches); returns ``(payload, {file name: Figure})`` with
    the Figures it saved."""
    from shardkit.bench.cli import run_bench
    from shardkit.bench.runner import RunConfig

    saved: dict[str, Figure] = {}
    original = Figure.savefig

    def capture(self, fname, *args, **kw):
        saved[str(fname).rsplit("/", 1)[-1]] = self
        return original(self, fname, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", capture)
    lines: list[str] = []
    payload = run_bench([str(data)], out, prefetch_factor="2", pin_memory="off",
                        backends="thread,process", persistent_workers="both",
                        echo=lambda msg="", err=False: None if err else lines.append(msg),
                        cfg=RunConfig(warmup=1, batches=2, repeats=1, batch_size=8,
                                      image_size=32), **kwargs)
    payload["printed"] = "\n".join(lines)
    return payload, saved


@pytest.fixture(scope="module")
def one_x_bench(packed_sample, tmp_path_factory):
    """Every series at num_workers=2, no step simulated (the case that drew 1.9..2.1 and a
    data-wait plot of 1.0s without a word)."""
    mp = pytest.MonkeyPatch()
    try:
        yield _bench(packed_sample("wds"), tmp_path_factory.mktemp("bench-one-x"), mp,
                     num_workers="2")
    finally:
        mp.undo()


def _legend_is_beside_the_axes(fig: Figure) -> None:
    fig.canvas.draw()
    ax = fig.axes[0]
    box, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
    assert legend.x0 >= box.x1, (legend, box)            # right of the plotting area: no overlap
    whole = fig.bbox
    assert whole.x0 <= legend.x0 and legend.x1 <= whole.x1 + 1   # and not cut off
    assert whole.y0 <= legend.y0 and legend.y1 <= whole.y1 + 1


def test_series_plots_span_one_num_workers_and_keep_legend_off_the_points(one_x_bench):
    payload, figs = one_x_bench
    assert sorted(figs) == sorted(payload["plots"]) == [
        "data_wait_vs_workers.png", "loader_vs_step.png", "throughput_vs_workers.png"]
    for name in ("throughput_vs_workers.png", "data_wait_vs_workers.png"):
        ax = figs[name].axes[0]
        lo, hi = ax.get_xlim()
        assert lo <= 1.5 and hi >= 2.5, (name, lo, hi)   # not matplotlib's 1.9..2.1
        assert list(ax.get_xticks()) == [2]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["wds/auto thread pf=2 pin=off", "wds/auto process pf=2 pin=off",
                          "wds/auto process pf=2 pin=off pers"]
        colors = [to_hex(c.lines[0].get_color()) for c in ax.containers]
        assert len(colors) == 3 and len(set(colors)) == 3, colors
        _legend_is_beside_the_axes(figs[name])
    _legend_is_beside_the_axes(figs["loader_vs_step.png"])


def test_without_a_step_every_plot_says_so(one_x_bench):
    payload, figs = one_x_bench
    assert payload["step"]["kind"] == "none"
    wait = figs["data_wait_vs_workers.png"].axes[0]
    title = wait.get_title()
    assert "no step simulated" in title and "every point is 1.0" in title
    assert "--step-ms" in title
    assert "no step simulated" in figs["throughput_vs_workers.png"].axes[0].get_title()
    assert "no step simulated" in figs["loader_vs_step.png"].axes[0].get_title()


def test_the_simulated_step_is_in_every_title(packed_sample, tmp_path, monkeypatch):
    payload, figs = _bench(packed_sample("wds"), tmp_path / "b", monkeypatch,
                           num_workers="0,1", step_ms=3.0)
    for name, fig in figs.items():
        assert "step: sleep 3 ms per batch (--step-ms)" in fig.axes[0].get_title(), name
    ax = figs["throughput_vs_workers.png"].axes[0]
    assert list(ax.get_xticks()) == [0, 1] and ax.get_xlim() == (-0.5, 1.5)


def test_series_colors_stay_distinct_past_the_default_cycle():
    from shardkit.bench.plots import series_colors

    for n in (1, 10, 11, 20, 21, 40):
        colors = [to_hex(c) for c in series_colors(n)]
        assert len(colors) == n and len(set(colors)) == n, n


def test_bench_table_shows_what_ran_and_sums_up_the_rest(one_x_bench):
    payload, _ = one_x_bench
    rows = payload["rows"]
    na = [r for r in rows if r["status"] == "n/a"]
    assert [r["id"] for r in na] == [1]     # thread + persistent workers: threads have none
    printed = payload["printed"]
    table = printed.split("not run:")[0]
    header = next(line for line in table.splitlines() if "loader ms" in line)
    body = [line for line in table.splitlines() if re.match(r"\s*\d+ (shardkit|baseline) ", line)]
    assert [int(line.split()[0]) for line in body] == [r["id"] for r in rows
                                                        if r["status"] != "n/a"]
    assert " n/a " not in table
    # no column that says the same thing on every row (no cache, no augment, no baseline)
    assert not re.search(r"\b(cache|augment|x base|x none)\b", header)
    assert len(header) < 140
    assert ("not run: 1 requested setting that does not apply here (every row is in "
            "bench.json):") in printed
    assert "  row 1: persistent_workers does not apply to the thread backend" in printed
    assert "  the same work as a measured row: 1 as row 0" in printed


def test_bench_notes_never_double_the_separator(one_x_bench, packed_sample, tmp_path):
    payload, _ = one_x_bench
    for r in payload["rows"]:
        note = r["note"] or ""
        assert "; ;" not in note and not note.endswith("; ") and not note.startswith("; "), r
    # num_workers=0 with a prefetch factor: the grid's note, then the runner's (empty) ones
    from shardkit.cli import main

    res = CliRunner().invoke(main, [
        "bench", "--data", str(packed_sample("wds")), "--out", str(tmp_path / "z"),
        "--num-workers", "0", "--prefetch-factor", "2", "--pin-memory", "off",
        "--image-size", "32", "--batch-size", "8", "--warmup", "1", "--batches", "2",
        "--repeats", "1"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "z" / "bench.json").read_text())["rows"]
    assert row["note"] == ("prefetch_factor=2 does not apply with num_workers=0 (batches are "
                           "built in the caller); measured without it")
    assert "; ;" not in res.output and "; \n" not in res.output


# ------------------------------------------------------------------------------ inspect, pack

def test_inspect_prints_sizes_and_plurals_a_person_reads(packed_sample, tmp_path):
    from shardkit.doctor import inspect_command
    from shardkit.dataset.manifest import load_manifest

    data = packed_sample("wds")
    res = CliRunner().invoke(inspect_command, [str(data), "--n", "2",
                                               "--out", str(tmp_path / "viz")])
    assert res.exit_code == 0, res.output
    shards = {s: e["shards"] for s, e in load_manifest(data)["splits"].items()}
    assert len(shards["train"]) > 1 and len(shards["val"]) == 1
    lines = {line.split(":")[0]: line for line in res.output.splitlines()
             if re.match(r"(train|val|test): \d", line)}
    for split, entry in shards.items():
        sizes = sorted(s["bytes"] for s in entry)
        for b in sizes:
            assert str(b) not in lines[split]            # no raw byte counts
        n = len(entry)
        if n == 1:
            assert lines[split] == (f"{split}: 1 shard, {entry[0]['num_samples']} samples, "
                                    f"{size_text(sizes[0])}")
        else:
            assert lines[split].startswith(f"{split}: {n} shards, ")
            assert (f"{size_text(sizes[0])} / " in lines[split]
                    and f" / {size_text(sizes[-1])} (min / median / max)" in lines[split])
        assert re.search(r"\d (KiB|MiB)", lines[split])
    names = sorted(p.name for p in (tmp_path / "viz").iterdir())
    assert "inspect_train_transformed.png" in names
    for name in names:
        words = name.removesuffix(".png").split("_")
        assert len(words) == len(set(words)), name    # no inspect_train_train_transform.png


def test_pack_summary_counts_take_their_plural(packed_sample):
    from shardkit.dataset.manifest import load_manifest
    from shardkit.packer.summary import PackSummary

    data = packed_sample("wds")
    manifest = load_manifest(data)
    assert len(manifest["splits"]["val"]["shards"]) == 1
    text = PackSummary.from_manifest(data, manifest, [], warnings=[], cleaned=[],
                                     num_with_warnings=0).format_text()
    assert re.search(r"^  val: \d+ samples \(\d\.\d{3}\), \d+ groups, 1 shard \[", text, re.M), text
    assert re.search(r"^  train: \d+ samples \(\d\.\d{3}\), \d+ groups, \d+ shards \[", text,
                     re.M), text
