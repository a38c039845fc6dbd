"""shardkit.sources.labels: normalisation, aliases, YAML label maps, unknown-label errors."""
from __future__ import annotations

import unicodedata

import pytest

from shardkit.errors import LabelError, UnknownLabelError
from shardkit.packer.scan import resolve_labels
from shardkit.sources.items import SourceItem
from shardkit.sources.labels import LabelMap, normalize_label

FLOWERS = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
CAFE_NFD = unicodedata.normalize("NFD", "Café")


def test_normalize_label():
    assert normalize_label("  roses \t\n") == "roses"
    assert normalize_label(CAFE_NFD) == "Café" and len(normalize_label(CAFE_NFD)) == 4
    with pytest.raises(LabelError, match="must be a string, got 3"):
        normalize_label(3)


def test_source_names_sorted_unique():
    """Without a YAML map, the classes are the scanned items' labels (NFC, stripped by the scan),
    sorted and unique."""
    names = ["tulips", "daisy", "roses", "daisy", "Café", normalize_label(CAFE_NFD)]
    items = [SourceItem(f"/data/{n}/{i}.jpg", f"{n}/{i}.jpg", n) for i, n in enumerate(names)]
    m, label_idx = resolve_labels(items, None)
    assert m.classes == ["Café", "daisy", "roses", "tulips"]
    assert m.num_classes == len(m) == 4
    assert label_idx == [3, 1, 2, 1, 0, 0]
    assert m.resolve_all(["daisy", " tulips", CAFE_NFD]) == {"daisy": 1, " tulips": 3,
                                                             CAFE_NFD: 0}


def test_yaml_list_with_aliases(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("classes: [daisy, dandelion, roses, sunflowers, tulips]\n"
                    "aliases: {Sunflower: sunflowers, \"向日葵\": sunflowers, 'rose ': roses}\n",
                    encoding="utf-8")
    m = LabelMap.from_yaml(path)
    assert m.classes == FLOWERS
    assert m.aliases == {"Sunflower": "sunflowers", "向日葵": "sunflowers", "rose": "roses"}
    assert m.resolve("sunflowers") == 3
    assert m.resolve("Sunflower ") == 3     # alias with a trailing space
    assert m.resolve("向日葵") == 3          # Unicode alias
    assert m.resolve("SUNFLOWER") == 3      # casefold alias
    assert m.resolve("Tulips") == 4         # casefold class
    assert m.resolve(" rose") == 2
    assert m.to_dict() == {"classes": FLOWERS, "aliases": m.aliases}


def test_yaml_mapping_form(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("classes:\n  tulips: []\n  sunflowers: [Sunflower, 向日葵]\n  roses: Rose\n"
                    "  daisy:\n", encoding="utf-8")
    m = LabelMap.from_yaml(path)
    assert m.classes == ["tulips", "sunflowers", "roses", "daisy"]  # file order = label index
    assert m.resolve_all(["向日葵", "rose", "daisy", "Tulips"]) == {
        "向日葵": 1, "rose": 2, "daisy": 3, "Tulips": 0}


def test_exact_match_before_casefold():
    m = LabelMap(["Rose", "rose", "tulip"], {"TULIPA": "tulip"})
    assert m.resolve("Rose") == 0 and m.resolve("rose") == 1
    assert m.resolve("tulipa") == 2
    with pytest.raises(UnknownLabelError) as err:  # ambiguous caseless match is not guessed
        m.resolve("ROSE")
    assert err.value.unknown == {"ROSE": ["Rose", "rose"]}


def test_unknown_names_all_listed_with_closest():
    m = LabelMap(FLOWERS, {"Sunflower": "sunflowers"})
    with pytest.raises(UnknownLabelError) as err:
        m.resolve_all(["daisy", "dasiy", "tulip", "sunflwer", "cactus", "dasiy"])
    e = err.value
    assert e.unknown == {"dasiy": ["daisy"], "tulip": ["tulips"], "sunflwer": ["sunflowers"],
                         "cactus": []}
    assert e.known == FLOWERS
    text = str(e)
    assert text.startswith("4 label(s) match no class")
    assert "'cactus' (closest: none)" in text and "'dasiy' (closest: 'daisy')" in text
    assert isinstance(e, LabelError)


@pytest.mark.parametrize("classes, aliases, match", [
    (["a", "b", "a "], {}, r"duplicate class name\(s\) \['a'\]"),
    (["a", "b"], {"x": "c"}, r"unknown classes: 'x' -> 'c'; known classes: \['a', 'b'\]"),
    (["a", "b"], {"b": "a"}, r"equal to another class's name: 'b' -> 'a'"),
    ([], {}, "at least one class"),
    (["a", " "], {}, "must not be empty"),
])
def test_invalid_maps(classes, aliases, match):
    with pytest.raises(LabelError, match=match):
        LabelMap(classes, aliases)


def test_alias_equal_to_own_class_is_dropped():
    assert LabelMap(["a", "b"], {"a": "a", "A ": "a"}).aliases == {"A": "a"}


@pytest.mark.parametrize("text, match", [
    ("classes: [a, b\n", "not valid YAML"),
    ("- a\n- b\n", "must be a mapping with a 'classes' key, got list"),
    ("labels: [a, b]\n", "with a 'classes' key"),
    ("classes: a\n", "'classes' must be a list or a mapping"),
    ("classes: [a, b]\naliases: [x]\n", "'aliases' must be a mapping"),
    ("classes: [a, b]\nextra: 1\n", r"unknown key\(s\) \['extra'\]"),
    ("classes: {a: {x: 1}}\n", "aliases of class 'a' must be a list"),
    ("classes: [a, a]\n", r"duplicate class name\(s\) \['a'\]"),
    ("classes: {a: [x], b: [x]}\n", "alias\\(es\\) given to two classes: 'x' -> 'a' and 'b'"),
    ("classes: [a]\naliases: {x: b}\n", "unknown classes: 'x' -> 'b'"),
])
def test_bad_yaml(tmp_path, text, match):
    path = tmp_path / "labels.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LabelError, match=match) as err:
        LabelMap.from_yaml(path)
    assert str(path) in str(err.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(LabelError, match="cannot read label map"):
        LabelMap.from_yaml(tmp_path / "absent.yaml")


def test_folder_labels_resolve_against_yaml(sample_dir, tmp_path):
    from shardkit.sources.folder import scan_folder

    path = tmp_path / "labels.yaml"
    path.write_text("classes: [tulips, sunflowers, roses, dandelion, daisy]\n", encoding="utf-8")
    names = {i.label for i in scan_folder(sample_dir).items}
    assert LabelMap.from_yaml(path).resolve_all(sorted(names)) == {
        "daisy": 4, "dandelion": 3, "roses": 2, "sunflowers": 1, "tulips": 0}


def test_yaml_non_string_names(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("classes: [0, 1, 2]\n", encoding="utf-8")
    assert LabelMap.from_yaml(path).classes == ["0", "1", "2"]
    path.write_text("classes: [yes, no]\n", encoding="utf-8")
    with pytest.raises(LabelError, match=r"name True \(bool\) is not a string; quote it"):
        LabelMap.from_yaml(path)
    path.write_text("classes: [a]\naliases: {1.5: a}\n", encoding="utf-8")
    with pytest.raises(LabelError, match=r"name 1.5 \(float\)"):
        LabelMap.from_yaml(path)


def test_a_100k_class_map_loads_and_its_duplicates_are_named(tmp_path):
    """The duplicate check is linear (a pairwise one takes minutes at this size) and the error
    names the duplicates and counts, without the 100,000 names."""
    names = FLOWERS + [f"class_{i:06d}" for i in range(99_995)]
    path = tmp_path / "labels.yaml"
    path.write_text("classes:\n" + "".join(f"- {n}\n" for n in names))
    m = LabelMap.from_yaml(path)
    assert m.num_classes == 100_000 and m.resolve("class_099994") == 99_999
    assert m.resolve_all(FLOWERS) == {n: i for i, n in enumerate(FLOWERS)}
    with pytest.raises(LabelError) as err:
        LabelMap(names + ["class_000007 ", "tulips"])
    assert str(err.value) == ("duplicate class name(s) ['class_000007', 'tulips'] (after Unicode "
                              "NFC + strip): 2 name(s) given more than once among 100002 "
                              "classes")
