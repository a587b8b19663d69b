from dataclasses import dataclass, field

import pytest

from mem_core.configuration import ConfigError, load_preset, preset_names, resolve, to_dict


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
    cfg = resolve(Stage, "s", overrides=["epochs=1", "lr=5e-4", "amp=false", "model.depth=4", "model.dims=[1, 2]"])
    assert (cfg.epochs, cfg.lr, cfg.amp, cfg.model.depth, cfg.model.dims) == (1, 5e-4, False, 4, (1, 2))


def test_paths_and_words_are_strings():
    cfg = resolve(Stage, "s", overrides=["data=../shared/data/ncars-dev", "model.mode=true", "init=runs/pre"])
    assert cfg.data == "../shared/data/ncars-dev"
    assert cfg.model.mode == "true"
    assert cfg.init == "runs/pre"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("epoch=1", "unknown config key 'epoch'; did you mean epochs"),
        ("model.width=3", "unknown config key model.'width'"),
        ("epochs=1.5", "epochs: expected an integer"),
        ("amp=yes", "amp: expected true or false"),
        ("model.dims=[1]", "expected 2 values"),
        ("epochs", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolve(Stage, "s", overrides=[override])


def test_file_table_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[s]\nepochs = 3\nlr = 0.1\n[s.model]\ndepth = 6\n[other]\nepochs = 99\n")
    cfg = resolve(Stage, "s", config_file=path, overrides=["lr=0.2"])
    assert (cfg.epochs, cfg.lr, cfg.model.depth) == (3, 0.2, 6)
    assert to_dict(cfg)["model"]["dims"] == [4, 8]


def test_bad_file_and_unknown_preset(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[s\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve(Stage, "s", config_file=path)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_preset("nope")


def test_bundled_presets_exist():
    assert {"cpu-tiny", "paper-ncars", "paper-ncaltech101", "paper-nimagenet"} <= set(preset_names())
