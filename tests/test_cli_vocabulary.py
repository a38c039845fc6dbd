"""One flag vocabulary across the commands (shardkit.cli_common): a positional DATASET, ``--out``
a results folder, ``--split`` a split name (pack's ratios are ``--split-ratios``), one name per
concept, ``--progress/--no-progress`` on every long command, bench's lists comma-separated or
repeated, ``--decoder`` a choice of the registry, help text on every option; old spellings
work as before. Run on a real pack of examples/flowers-sample."""
from __future__ import annotations

import io
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from shardkit.cli import COMMANDS, main

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
LONG_COMMANDS = ["pack", "verify", "check", "stats", "inspect", "cache build", "bench"]
SMALL_BENCH = ["--prefetch-factor", "2", "--pin-memory", "off", "--image-size", "32",
               "--batch-size", "4", "--warmup", "0", "--batches", "1", "--repeats", "1"]


def _run(*args, ok=(0,)):
    result = CliRunner().invoke(main, ["-q", *map(str, args)])
    assert result.exit_code in ok, result.output + repr(result.exception)
    return result


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """examples/flowers-sample packed with the new spellings (200 photos, 3 splits)."""
    out = tmp_path_factory.mktemp("vocab") / "ds"
    _run("pack", SAMPLE, out, "--split-ratios", "train=0.6,val=0.2,test=0.2",
         "--near-threshold", "4", "--no-progress")
    return out


def _commands() -> dict[str, click.Command]:
    """Every command of ``shardkit`` by its full name ("cache build"), the group's own too."""
    ctx = click.Context(main)
    out = {"shardkit": main}

    def walk(prefix, group):
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                out[f"{prefix}{name}"] = cmd
                walk(f"{prefix}{name} ", cmd)
            else:
                out[f"{prefix}{name}"] = cmd

    walk("", main)
    return out


def _options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option)]


def _option(cmd: click.Command, flag: str) -> click.Option:
    return next(p for p in _options(cmd) if flag in p.opts + p.secondary_opts)


def _records(root: Path) -> dict[str, list[tuple]]:
    return {split: sorted((r["key"], r["label"]) for r in map(json.loads, (root / "splits" /
            f"{split}.jsonl").read_text().splitlines()))
            for split in json.loads((root / "manifest.json").read_text())["splits"]}


# --- 1. the dataset is a positional DATASET in every command ---------------------------------

def test_every_command_names_its_dataset_DATASET():
    commands = _commands()
    assert {"pack", "verify", "check", "stats", "inspect", "cache build", "export",
            "bench"} <= set(commands)
    for name, cmd in commands.items():
        args = [p for p in cmd.params if isinstance(p, click.Argument)]
        names = [a.name for a in args if a.name != "src"]
        assert names in ([], ["dataset"]), (name, names)
        for a in args:
            if a.name == "dataset":
                assert a.make_metavar(click.Context(cmd)).startswith("DATASET"), name
    assert [a.name for a in commands["pack"].params if isinstance(a, click.Argument)] == \
        ["src", "dataset"]


def test_every_reader_takes_the_dataset_positionally(dataset, tmp_path):
    assert "OK" in _run("verify", dataset, "--no-decode").output
    checked = _run("check", dataset, "--near-duplicates", "off", "--no-transforms").output
    assert "not run: near_duplicates, transform_drift" in checked
    stats = _run("stats", dataset, "--split", "val", "--no-save", "--json",
                 tmp_path / "stats.json").output
    assert "val: " in stats and "mean (R, G, B)" in stats
    assert "{" not in stats                              # said once, as text; JSON on request
    saved = json.loads((tmp_path / "stats.json").read_text())
    assert saved["num_samples"] == len(_records(dataset)["val"]) and len(saved["mean"]) == 3
    assert (saved["dataset"], saved["split"]) == (str(dataset), "val")
    (tmp_path / "a-file").write_text("x")
    for command in (["stats", dataset, "--no-save"], ["check", dataset, "--no-transforms"],
                    ["inspect", dataset, "--out", tmp_path / "g"]):   # refused before any work
        refused = _run(*command, "--json", tmp_path / "a-file" / "r.json", ok=(2,)).output
        assert f"a-file is a file, not a folder" in refused and "mean (R, G, B)" not in refused
    _run("inspect", dataset, "--split", "test", "--n", "2", "--out", tmp_path / "grids")
    grids = list((tmp_path / "grids").iterdir())
    assert grids and all(p.suffix == ".png" for p in grids)
    built = json.loads(_run("cache", "build", dataset, "--split", "test", "--cache",
                            f"disk:{tmp_path / 'cache'}", "--num-workers", "0").output)
    assert built["filled_samples"] == built["num_samples"] == len(_records(dataset)["test"])
    exported = _run("export", dataset, "--to", "timm").output
    assert "shards/_info.json" in exported


def test_a_missing_dataset_folder_is_named_in_one_error(tmp_path):
    for command in (["verify"], ["check"], ["stats"], ["inspect"], ["bench"],
                    ["cache", "build"], ["export"]):
        result = CliRunner().invoke(main, [*command, str(tmp_path / "nope")])
        assert result.exit_code == 2, (command, result.output)
        assert "Invalid value for 'DATASET" in result.output and "nope" in result.output, \
            (command, result.output)
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "Missing argument 'DATASET...'" in result.output
    assert not (tmp_path / "b").exists()


# --- 2. --out is the folder a command writes its results to ----------------------------------

def test_every_out_option_is_a_results_folder():
    found = []
    for name, cmd in _commands().items():
        for opt in _options(cmd):
            if "--out" in opt.opts:
                found.append(name)
                assert isinstance(opt.type, click.Path) and not opt.type.file_okay, name
                assert opt.name != "dataset" and "DATASET" not in (opt.metavar or ""), name
    assert sorted(found) == ["bench", "inspect", "train"]


def test_inspect_out_and_its_old_spelling_write_the_same_grids(dataset, tmp_path):
    for flag in ("--out", "--out-dir"):
        res = _run("inspect", dataset, "--split", "val", "--n", "3", flag, tmp_path / flag)
        assert str(tmp_path / flag) in res.output
    new, old = ({p.name: p.stat().st_size > 0 for p in (tmp_path / f).iterdir()}
                for f in ("--out", "--out-dir"))
    assert new == old and new and all(new.values())
    assert not any(p.suffix == ".png" for p in dataset.rglob("*"))  # never inside DATASET


# --- 3. --split is a split name, pack's ratios are --split-ratios ----------------------------

def test_split_names_a_split_everywhere_but_pack():
    for name, cmd in _commands().items():
        for opt in _options(cmd):
            if "--split" in opt.opts:
                if name == "pack":
                    assert opt.opts == ["--split-ratios", "--split"] and opt.name == "split_spec"
                    assert "--split is the old spelling" in opt.help
                else:
                    assert opt.opts == ["--split"] and opt.name == "split", name


def test_pack_split_ratios_and_the_old_split_pack_the_same(dataset, tmp_path):
    _run("pack", SAMPLE, tmp_path / "old", "--split", "train=0.6,val=0.2,test=0.2",
         "--no-progress")
    assert _records(tmp_path / "old") == _records(dataset)
    assert [len(v) for v in _records(dataset).values()] == [114, 47, 39]
    _run("pack", SAMPLE, tmp_path / "one", "--split-ratios", "train=1", "--no-progress",
         "--near-duplicates", "off")
    assert {k: len(v) for k, v in _records(tmp_path / "one").items()} == {"train": 200}


# --- 4. one name per concept: --near-threshold, --near-duplicates ----------------------------

def test_pack_and_check_share_the_near_duplicate_names():
    commands = _commands()
    for name in ("pack", "check"):
        threshold = _option(commands[name], "--near-threshold")
        assert threshold.opts[0] == "--near-threshold" and threshold.type.max == 64
        assert _option(commands[name], "--near-duplicates").opts == ["--near-duplicates"]
    assert _option(commands["check"], "--phash-threshold") is \
        _option(commands["check"], "--near-threshold")
    assert _option(commands["check"], "--no-near-duplicates").help.startswith(
        "Alias of --near-duplicates off")


def _check_report(dataset, tmp_path, *flags) -> dict:
    path = tmp_path / f"check{len(list(tmp_path.iterdir()))}.json"
    _run("check", dataset, "--no-transforms", "--json", path, *flags)
    return json.loads(path.read_text())


def test_check_near_threshold_and_its_old_spelling_agree(dataset, tmp_path):
    wide = _check_report(dataset, tmp_path, "--near-threshold", "64")
    assert wide == _check_report(dataset, tmp_path, "--phash-threshold", "64")
    exact = _check_report(dataset, tmp_path, "--near-threshold", "0")
    assert len(wide["near_duplicates"]) > len(exact["near_duplicates"])
    # 200 photos in splits of 114, 47, 39: every cross-split pair is within 64 bits
    assert len(wide["near_duplicates"]) == 114 * 47 + 114 * 39 + 47 * 39


def test_check_near_duplicates_off_and_its_old_spelling_agree(dataset, tmp_path):
    off = _check_report(dataset, tmp_path, "--near-duplicates", "off")
    assert off["near_duplicates"] is None
    assert off == _check_report(dataset, tmp_path, "--no-near-duplicates")
    report = _check_report(dataset, tmp_path, "--near-duplicates", "report")
    assert report["near_duplicates"] is not None  # searched: a list of pairs
    assert report == _check_report(dataset, tmp_path)  # report is the default
    both = CliRunner().invoke(main, ["check", str(dataset), "--no-near-duplicates",
                                     "--near-duplicates", "report"])
    assert both.exit_code == 2
    errors = [line for line in both.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--no-near-duplicates" in errors[0] \
        and "--near-duplicates report" in errors[0], both.output
    merge = CliRunner().invoke(main, ["check", str(dataset), "--near-duplicates", "merge"])
    assert merge.exit_code == 2 and "'merge' is not one of 'report', 'off'" in merge.output


# --- 5. --progress/--no-progress on every long command ---------------------------------------

@pytest.mark.parametrize("name", LONG_COMMANDS)
def test_every_long_command_has_progress_defaulting_to_the_terminal(name):
    opt = _option(_commands()[name], "--progress")
    assert opt.opts == ["--progress"] and opt.secondary_opts == ["--no-progress"]
    assert opt.default is None and "terminal" in opt.help


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _stderr_of(cmd, args, monkeypatch, tty: bool) -> str:
    """``cmd`` run on ``args`` with stderr a terminal (``tty``) or a pipe; its stderr text."""
    err = _Tty() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    try:
        cmd.main([str(a) for a in args], standalone_mode=False)
    finally:
        monkeypatch.undo()
    return err.getvalue()


def test_verify_shows_a_bar_on_a_terminal(dataset, monkeypatch):
    from shardkit.doctor.verify import verify_command

    shards = sum(len(s["shards"]) for s in
                 json.loads((dataset / "manifest.json").read_text())["splits"].values())
    bar = _stderr_of(verify_command, [dataset, "--no-decode"], monkeypatch, tty=True)
    assert "verify" in bar and f"{shards}/{shards}" in bar and "shard" in bar
    assert _stderr_of(verify_command, [dataset, "--no-decode"], monkeypatch, tty=False) == ""
    assert _stderr_of(verify_command, [dataset, "--no-decode", "--no-progress"], monkeypatch,
                      tty=True) == ""
    forced = CliRunner().invoke(verify_command, [str(dataset), "--no-decode", "--progress"])
    assert forced.exit_code == 0 and f"{shards}/{shards}" in forced.stderr
    assert "OK" in forced.stdout


def test_pack_progress_follows_the_terminal_and_no_progress_still_works(tmp_path, monkeypatch):
    from shardkit.packer.cli import pack_command

    base = ["--split-ratios", "train=1", "--near-duplicates", "off"]
    tty = _stderr_of(pack_command, [SAMPLE, tmp_path / "a", *base], monkeypatch, tty=True)
    assert "write" in tty and "200/200" in tty
    assert _stderr_of(pack_command, [SAMPLE, tmp_path / "b", *base], monkeypatch,
                      tty=False) == ""
    assert _stderr_of(pack_command, [SAMPLE, tmp_path / "c", *base, "--no-progress"],
                      monkeypatch, tty=True) == ""
    assert _records(tmp_path / "a") == _records(tmp_path / "b") == _records(tmp_path / "c")


def test_cache_build_progress_follows_the_terminal(dataset, tmp_path, monkeypatch):
    from shardkit.stream.cache_cli import cache_command

    args = ["build", dataset, "--split", "test", "--num-workers", "0", "--cache"]
    n = len(_records(dataset)["test"])
    tty = _stderr_of(cache_command, [*args, f"disk:{tmp_path / 'a'}"], monkeypatch, tty=True)
    assert "cache test" in tty and f"{n}/{n}" in tty
    assert _stderr_of(cache_command, [*args, f"disk:{tmp_path / 'b'}"], monkeypatch,
                      tty=False) == ""


# --- 6. bench: DATASET positional, every list comma-separated or repeated ---------------------

def test_bench_lists_take_commas_or_repeats_and_data_is_an_alias(dataset, tmp_path):
    repeated = _run("bench", dataset, "--out", tmp_path / "a", "--num-workers", "0",
                    "--num-workers", "1", "--decoder", "pil", "--decoder", "auto,pil",
                    "--format", "wds", "--backend", "thread", "--backend", "thread",
                    "--cache", "none", "--augment", "none", "--progress", *SMALL_BENCH)
    commas = _run("bench", "--data", dataset, "--out", tmp_path / "b", "--num-workers", "0,1",
                  "--decoder", "pil,auto", "--format", "wds", "--no-progress", *SMALL_BENCH)
    a, b = (json.loads((tmp_path / f / "bench.json").read_text()) for f in "ab")
    assert a["config"] == b["config"]
    assert a["config"]["num_workers"] == [0, 1] and a["config"]["decoders"] == ["pil", "auto"]
    assert a["config"]["data"] == [str(dataset)] and a["config"]["backends"] == ["thread"]
    assert [r["requested"] for r in a["rows"]] == [r["requested"] for r in b["rows"]]
    assert len(a["rows"]) == 4
    ran = sum(r["status"] == "ok" for r in a["rows"])
    assert ran == 4
    # a line per row on stderr either way; the bar only with --progress
    for result in (repeated, commas):
        assert sum(line.startswith("[shardkit row ") for line in
                   result.stderr.splitlines()) == ran
    autos = len(a["auto"])          # the auto row per decoder, counted in the bar's total
    assert autos == 2 and f"0/{ran + autos}" in repeated.stderr
    assert f"{ran + autos}/{ran + autos}" in repeated.stderr and "row" in repeated.stderr
    assert "bench:" in repeated.stderr and "bench:" not in commas.stderr


def test_bench_refuses_an_empty_list_item(dataset, tmp_path):
    result = CliRunner().invoke(main, ["bench", str(dataset), "--decoder", "pil,",
                                       "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "has an empty item" in result.output
    assert not (tmp_path / "x").exists()


# --- 7. --decoder is a choice of the registry; every option has help --------------------------

def test_decoder_is_a_choice_of_the_registry(dataset, tmp_path):
    from shardkit.decode import DECODERS

    commands = _commands()
    for name in ("check", "stats", "inspect", "bench"):
        opt = _option(commands[name], "--decoder")
        choice = opt.type.item if name == "bench" else opt.type
        assert isinstance(choice, click.Choice), name
        assert list(choice.choices) == ["auto", *DECODERS], name
    for command in (["stats", str(dataset)], ["bench", str(dataset), "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(main, [*command, "--decoder", "libjpeg"])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--decoder'" in result.output
        assert "'libjpeg' is not one of 'auto', 'roi', 'turbojpeg', 'pil', 'nvjpeg'" in \
            result.output
    assert not (tmp_path / "o").exists()
    stats = _run("stats", dataset, "--split", "test", "--decoder", "pil", "--no-save").output
    assert "test: " in stats


def _help_cases() -> list:
    cases = []
    for name in ["shardkit", *sorted(COMMANDS), "cache build"]:
        cases.append(pytest.param(name, id=name.replace(" ", "-")))
    return cases


@pytest.mark.parametrize("name", _help_cases())
def test_every_option_has_help(name):
    cmd = _commands()[name]
    missing = [opt.opts[0] for opt in _options(cmd) if not (opt.help or "").strip()]
    assert not missing, f"shardkit {name}: options without help: {missing}"
