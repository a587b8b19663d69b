import re
import tracemalloc
from dataclasses import dataclass, field, replace

import pytest

from mem_core import configuration
from mem_core.configuration import ConfigError, apply_overrides, load_preset, merge, preset_names, to_dict
from mem_core.train.configs import STAGES, stage_config, stage_tables
from recorders.config import IngestConfig, RecordConfig


@dataclass
class Inner:
    depth: int = 2
    dims: tuple[int, int] = (4, 8)
    mode: str = "a"


@dataclass
class Stage:
    epochs: int = 10
    lr: float = 1e-3
    amp: bool = True
    data: str = ""
    init: str | None = None
    model: Inner = field(default_factory=Inner)


def test_overrides_are_typed_and_nested():
    cfg = apply_overrides(Stage(), ["epochs=1", "lr=5e-4", "amp=false", "model.depth=4", "model.dims=[1, 2]"])
    assert (cfg.epochs, cfg.lr, cfg.amp, cfg.model.depth, cfg.model.dims) == (1, 5e-4, False, 4, (1, 2))


def test_paths_and_words_are_strings():
    cfg = apply_overrides(Stage(), ["data=path/to/n-cars", "model.mode=true", "init=runs/pre"])
    assert cfg.data == "path/to/n-cars"
    assert cfg.model.mode == "true"
    assert cfg.init == "runs/pre"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("epoch=1", "unknown config key 'epoch'; did you mean epochs"),
        ("model.width=3", "unknown config key model.'width'"),
        ("epochs=1.5", "epochs: expected an integer"),
        ("amp=yes", "amp: expected true or false"),
        ("model.dims=[1]", "model.dims: too few values"),
        ("epochs", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        apply_overrides(Stage(), [override])


@pytest.mark.parametrize(
    ("stage", "override", "message"),
    [
        ("finetune", "batch_size=0", "batch_size must be a number >= 1, got 0"),
        ("pretrain", "accum_steps=0", "accum_steps must be a number >= 1, got 0"),
        ("finetune", "lr=nan", "lr must be a number >= 0, got nan"),
        ("finetune", "epochs=-1", "epochs must be a number >= 1, got -1"),
        ("finetune", "betas=[0.9, 1.0]", "betas must be in [0, 1), got (0.9, 1.0)"),
        ("finetune", "data.label_fraction=0", "data.label_fraction must be in (0, 1], got 0.0"),
        ("finetune", "data.num_workers=-2", "data.num_workers must be a number >= -1"),
        ("pretrain", "mask_ratio=1.0", "mask_ratio must be in (0, 1), got 1.0"),
        ("tokenizer", "grad_clip=inf", "grad_clip must be a number >= 0, got inf"),
        ("finetune", "model.depth=100000", "model.depth must be in [1, 256], got 100000"),
        ("finetune", "model.embed_dim=999996", "model.embed_dim must be in [1, 8192], got 999996"),
        ("finetune", "model.num_heads=0", "model.num_heads=0: model.num_heads must be in [1, 8192], got 0"),
        ("pretrain", "model.patch_size=1", "model.img_size 224 in patches of 1 px gives 50176 tokens, at most 4096"),
        ("pretrain", "model.img_size=4096", "model.img_size must be in [1, 2048], got 4096"),
        ("tokenizer", "model.num_tokens=1000000", "model.num_tokens must be in [2, 65536], got 1000000"),
        ("tokenizer", "model.hidden_dim=8192", "model: these sizes make about 9e+09 parameters, at most"),
        ("finetune", "input.n_max=2000000", "input.n_max must be in [1, 1000000], got 2000000"),
        ("segment", "head_channels=100000", "head_channels must be in [1, 8192], got 100000"),
    ],
)
def test_values_outside_their_range_are_config_errors(stage, override, message):
    """Caught when the config is built, naming the key: not a traceback, a NaN loss or a missing checkpoint later."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        stage_config(stage, preset="cpu-tiny", overrides=[override])


def test_a_config_key_under_its_former_name_is_refused_naming_the_new_one():
    """``data.labels`` is a fraction no more: ``--labels`` names a folder of captures, ``source.labels`` classes."""
    with pytest.raises(ConfigError, match=re.escape("config key 'data.labels' is now 'data.label_fraction'")):
        stage_config("finetune", preset="cpu-tiny", overrides=["data.labels=0.1"])


def test_record_and_ingest_options_outside_their_range_are_errors(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("duration_s must be a number > 0, got -5")):
        RecordConfig(source="sim", out=tmp_path, duration_s=-5)
    with pytest.raises(ConfigError, match="workers must be a number >= 0"):
        IngestConfig(paths=(tmp_path,), out=tmp_path, workers=-1)


def test_shared_tables_then_the_stage_table_then_options_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "[input]\nsize = [48, 48]\nshift_px = 3\n[vit]\ndepth = 6\nembed_dim = 96\n"
        "[finetune]\nepochs = 3\nlr = 0.1\ninput.shift_px = 5\n[finetune.model]\ndepth = 8\n"
        "[pretrain]\nepochs = 99\n"
    )
    cfg = stage_config("finetune", config_file=path, values={"data.dataset": "sim", "lr": 0.3}, overrides=["epochs=4"])
    assert (cfg.epochs, cfg.lr, cfg.data.dataset) == (4, 0.3, "sim")
    assert (cfg.input.size, cfg.input.shift_px) == ((48, 48), 5)  # the stage's own value wins over [input]
    assert (cfg.model.depth, cfg.model.embed_dim) == (8, 96)  # [vit] is the model of the ViT stages ...
    tokenizer = stage_config("tokenizer", config_file=path)
    assert tokenizer.input.size == (48, 48) and tokenizer.model.num_layers == 4  # ... not the tokenizer's
    assert to_dict(cfg)["input"]["size"] == [48, 48]


def test_unknown_tables_and_bad_files_are_errors(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text("[finetun]\nepochs = 3\n")
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \[finetun\]"):
        stage_config("finetune", config_file=path)
    path = tmp_path / "bad.toml"
    path.write_text("[s\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        stage_config("finetune", config_file=path)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_preset("nope")


@pytest.mark.parametrize(
    "text",
    ["a." * 5_000 + "b = 1\n", "[" + "a ." * 5_000 + "b]\n", "[data]\nx = {" + '"a".' * 5_000 + "b = 1}\n"],
    ids=["key", "table header", "quoted parts in an inline table"],
)
def test_a_key_of_thousands_of_parts_is_refused_before_it_is_parsed(tmp_path, text):
    """tomllib's time and memory grow with the square of a dotted key's parts: 44 s and 10.5 GB for 50,000."""
    path = tmp_path / "deep.toml"
    path.write_text(text)
    load_preset("cpu-tiny")  # (what reading a file imports is not what is measured)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=f"{path}: not valid TOML: a key of more than 16 parts"):
            configuration.load_toml(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # (reading the file takes a 1 MB buffer) where tomllib took 100 MB for 5,000 parts


def test_dots_in_strings_and_comments_are_no_key_parts(tmp_path):
    path = tmp_path / "dots.toml"
    dots = ".".join("abcdefghijklmnopqrstu")
    path.write_text(f"# {dots}\n[data]\npath = \"{dots}\"\nsplit_file = '{dots}'\n")
    assert configuration.load_toml(path) == {"data": {"path": dots, "split_file": dots}}


def test_a_config_file_extends_a_preset_and_states_only_its_changes(tmp_path, monkeypatch):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "cpu-small"\n[finetune]\nlr = 3e-4\n')
    mine = stage_config("finetune", config_file=path)
    tiny = stage_config("finetune", preset="cpu-tiny")
    assert mine.lr == 3e-4 and mine.eval_every == 4  # its own change, then cpu-small's over cpu-tiny's 1
    assert mine.model == replace(tiny.model, stem="resnet")  # cpu-small's one change to cpu-tiny's model
    # a stage's dotted `input.` key changes that field alone; the rest of cpu-tiny's [input] stays
    cpu_small_augmentations = {"event_drop_p": 0.75, "flip_polarity_p": 0.5, "scale_jitter": 0.25}
    assert mine.input == replace(tiny.input, **cpu_small_augmentations) and mine.layer_decay == tiny.layer_decay
    assert stage_config("pretrain", config_file=path).epochs == 200

    path.write_text("extends = 3\n")
    with pytest.raises(ConfigError, match="extends must be the name of a bundled preset"):
        stage_config("finetune", config_file=path)
    monkeypatch.setattr(configuration, "PRESET_DIR", tmp_path)
    (tmp_path / "a.toml").write_text('extends = "b"\n')
    (tmp_path / "b.toml").write_text('extends = "a"\n')
    with pytest.raises(ConfigError, match="in a loop: a -> b -> a"):
        stage_config("finetune", preset="a")


@pytest.mark.parametrize("preset", preset_names())
def test_presets_state_only_what_differs_from_the_defaults(preset):
    """Defaults live in the dataclasses: a preset value equal to what it would get anyway is noise, and a default
    changed later would silently stop applying to the presets that restate the old one."""
    doc = load_preset(preset)
    for stage in STAGES:
        config = STAGES[stage]()
        for table in stage_tables(doc, stage, preset):
            changed = merge(config, table)
            before, after = to_dict(config), to_dict(changed)
            restated = [key for key, _ in _leaves(table) if _at(before, key) == _at(after, key)]
            assert restated == [], f"{preset} [{stage}] restates {restated}"
            config = changed


def _at(values: dict, dotted: str):
    for part in dotted.split("."):
        values = values[part]
    return values


def _leaves(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict) and key in ("input", "data", "model"):
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def test_bundled_presets_exist():
    assert {"cpu-tiny", "cpu-small", "paper-ncars", "paper-ncaltech101", "paper-nimagenet"} <= set(preset_names())


def test_overrides_that_only_fit_together_may_come_in_any_order():
    from mem_core.train.configs import FinetuneStageConfig

    cfg = apply_overrides(FinetuneStageConfig(), ["model.embed_dim=32", "model.num_heads=2"])  # 32 % 12 != 0 alone
    assert (cfg.model.embed_dim, cfg.model.num_heads) == (32, 2)
    with pytest.raises(ConfigError, match=r"--set model.embed_dim=33: embed_dim 33 is not divisible by num_heads 12"):
        apply_overrides(FinetuneStageConfig(), ["model.embed_dim=33"])


@pytest.mark.parametrize(
    ("alone", "with_it"),
    [
        ("frozen_layers=14", "model.depth=16"),  # frozen layers need the depth that comes with them (12 alone)
        ("model.depth=200", "model.embed_dim=96"),  # too many parameters at the default width
    ],
)
def test_a_rule_between_fields_is_checked_once_all_overrides_are_in(alone, with_it):
    """Every rule between fields (``ConfigConflict``) waits for the other overrides: the two settings read the same
    in either order, and one that is still inconsistent at the end is refused naming it."""
    from mem_core.train.configs import FinetuneStageConfig

    assert apply_overrides(FinetuneStageConfig(), [alone, with_it]) == apply_overrides(
        FinetuneStageConfig(), [with_it, alone]
    )
    with pytest.raises(ConfigError, match=re.escape(f"--set {alone}: ")):
        apply_overrides(FinetuneStageConfig(), [alone])
