"""Mutants of real data, for the fuzz tests: seeded byte and JSON mutants of files (``byte_mutants``,
``json_mutants``: ``tests/test_fuzz_files.py`` through ``damaged_files.ChildReader``) and hypothesis-drawn mutants of
multipart messages (``mutant``: ``tests/test_fuzz_live.py``). Both draw their absurd values from here."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from mem_core.limits import MAX_ELEMENTS, MAX_JSON_DEPTH, MAX_SENSOR_SIDE

ABSURD = [2**62, 2**31, -1, 0, 1e308, "x", None, [], {}, True]  # what a seeded JSON mutant puts in a leaf


# ---- JSON paths ------------------------------------------------------------------------------------------------


def json_paths(value, prefix=()) -> list[tuple]:
    """Every key path into a JSON value."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path for key, child in items for path in [(*prefix, key), *json_paths(child, (*prefix, key))]]


def json_get(value, path):
    for key in path:
        value = value[key]
    return value


def json_set(value, path: tuple, new) -> None:
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


# ---- seeded mutants of files -----------------------------------------------------------------------------------


def truncations(data: bytes, header: int) -> Iterator[tuple[str, bytes]]:
    """Cuts inside and right after the header, and at several points of the body."""
    points = {1, header // 2, header - 1, header, header + 1, header + 3}
    points |= {int(len(data) * f) for f in (0.1, 0.5, 0.9)} | {len(data) - 1}
    for n in sorted(p for p in points if 0 < p < len(data)):
        yield f"cut at {n}", data[:n]


def flips(data: bytes, lo: int, hi: int, rng: random.Random, count: int, bits: int) -> Iterator[tuple[str, bytes]]:
    """``count`` mutants with ``bits`` random bit flips each in ``data[lo:hi]``."""
    for k in range(count):
        out = bytearray(data)
        for _ in range(bits):
            i = rng.randrange(lo, min(hi, len(data)))
            out[i] ^= 1 << rng.randrange(8)
        yield f"{bits} flips in [{lo}, {hi}) #{k}", bytes(out)


def garbage(data: bytes, header: int, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """The header followed by random bytes (as long as the real body, and a short run)."""
    for n in (len(data) - header, 64):
        yield f"header + {n} random bytes", data[:header] + rng.randbytes(n)


def byte_mutants(data: bytes, header: int, rng: random.Random, flipped: int = 6) -> list[tuple[str, bytes]]:
    """The standard mutant set of a file whose header ends at ``header``."""
    return [
        *truncations(data, header),
        *flips(data, 0, max(header, 16), rng, flipped, 3),
        *flips(data, 0, len(data), rng, flipped, 8),
        *garbage(data, header, rng),
    ]


def json_mutants(value: dict, rng: random.Random, count: int) -> Iterator[tuple[str, dict]]:
    """``count`` copies of ``value``, each with one random leaf replaced by an absurd value, or removed."""
    leaves = [path for path in json_paths(value) if not isinstance(json_get(value, path), dict | list)]
    for _ in range(count):
        path = rng.choice(leaves)
        out = copy.deepcopy(value)
        parent = json_get(out, path[:-1])
        new = rng.choice([*ABSURD, "remove"])
        if new == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = new if new != "remove" else None
        yield f"{'/'.join(map(str, path))} = {new!r}", out


# ---- hypothesis-drawn mutants of multipart messages --------------------------------------------------------------


EXTREMES = [-1, 0, 2**31, 2**62, 2**63, 10**40, 10**4000, MAX_ELEMENTS + 1, MAX_SENSOR_SIDE + 1, 1e40, 1e308, 5e-324]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(EXTREMES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.none(),
    st.booleans(),
    st.text(max_size=20),
    st.text(min_size=2000, max_size=3000),
    st.lists(st.integers(-5, 5), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 2).map(lambda d: json.loads("[" * d + "]" * d)),
)
NUMERIC_DTYPES = ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"]
ABSURD_SHAPES = st.lists(st.sampled_from([0, 1, 2, 2**31, 2**62, 10**40, 1e40, -1]), min_size=1, max_size=10)


def _with_header(frames: list[bytes], header) -> list[bytes]:
    return [frames[0], json.dumps(header).encode(), *frames[2:]]


def cut(data, frames):
    i = data.draw(st.integers(0, len(frames) - 1))
    return [*frames[:i], frames[i][: data.draw(st.integers(0, max(len(frames[i]) - 1, 0)))], *frames[i + 1 :]]


def flip_bits(data, frames):
    """1 to 8 bits flipped anywhere in the message (each byte equally likely: mostly the header and buffers)."""
    raw, ends = bytearray(b"".join(frames)), np.cumsum([len(f) for f in frames])
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    return [bytes(raw[start:end]) for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def drop_or_repeat_frames(data, frames):
    i = data.draw(st.integers(0, len(frames) - 1))
    choice = data.draw(st.sampled_from(["drop", "repeat", "append"]))
    if choice == "drop":
        return frames[:i] + frames[i + 1 :]
    return [*frames, frames[i] if choice == "repeat" else data.draw(st.binary(max_size=64))]


def garbage_buffers(data, frames):
    """A valid header, then random bytes: of the declared lengths (valid sizes, random content) or any length."""
    same = data.draw(st.booleans())
    return frames[:2] + [
        data.draw(st.binary(min_size=len(f), max_size=len(f)) if same else st.binary()) for f in frames[2:]
    ]


def retyped_buffers(data, frames):
    """A buffer declared as another numeric dtype with content of the right length: valid sizes, any values
    (random bytes, or the dtype's extremes everywhere: a u8 mask of class 2^64 - 1, NaN probabilities, ...)."""
    header = json.loads(frames[1])
    if not header["buffers"]:
        return frames
    i = data.draw(st.integers(0, len(header["buffers"]) - 1))
    spec = header["buffers"][i]
    dtype = np.dtype(data.draw(st.sampled_from(NUMERIC_DTYPES)))
    spec["dtype"] = dtype.str
    shape, size = spec["shape"], int(np.prod(spec["shape"])) * dtype.itemsize
    frames = _with_header(frames, header)
    if data.draw(st.booleans()):
        frames[2 + i] = data.draw(st.binary(min_size=size, max_size=size))
    else:
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype) if dtype.kind in "iu" else None
        extremes = [0, 1] if info is None else [info.min, info.max, *([np.nan, np.inf] if dtype.kind == "f" else [])]
        frames[2 + i] = np.full(shape, data.draw(st.sampled_from(extremes)), dtype).tobytes()
    return frames


def hostile_field(data, frames):
    """A header field (any but the buffer table, which ``absurd_sizes`` and ``retyped_buffers`` take on) deleted
    or set to a hostile value, or a field of another kind added."""
    header = json.loads(frames[1])
    paths = [path for path in json_paths(header) if path[0] != "buffers"]
    if data.draw(st.integers(0, 3)) == 0:
        header[data.draw(st.sampled_from(["height", "width", "num_tokens", "classes", "top_k", "x"]))] = data.draw(
            HOSTILE_VALUES
        )
    else:
        path = data.draw(st.sampled_from(paths))
        if data.draw(st.integers(0, 4)) == 0 and isinstance(parent := json_get(header, path[:-1]), dict):
            del parent[path[-1]]
        else:
            json_set(header, path, data.draw(HOSTILE_VALUES))
    return _with_header(frames, header)


def absurd_sizes(data, frames):
    """Declared sizes far beyond what the frames hold or a receiver should allocate; an empty frame for a shape
    with a zero in it (the sizes then agree: only the shape itself is absurd)."""
    header = json.loads(frames[1])
    if not header["buffers"] or data.draw(st.booleans()):
        header["buffers"].append({"name": "extra", "dtype": "<f4", "shape": [1]})
        frames = [*frames, b"\0" * 4]
    for i, spec in enumerate(header["buffers"]):
        if data.draw(st.booleans()):
            spec["shape"] = data.draw(ABSURD_SHAPES)
            if 0 in spec["shape"]:
                frames[2 + i] = b""
    for key in ("height", "width", "num_tokens"):
        if key in header:
            header[key] = data.draw(st.sampled_from([0, -1, 4097, 10**8, 10**12, 10**40, 2**64]))
    if "classes" in header and data.draw(st.booleans()):
        header["classes"] = ["c"] * data.draw(st.sampled_from([0, 70_000]))
    return _with_header(frames, header)


def deep_json(data, frames):
    """A header that nests deeper than any receiver should follow, as the whole header or inside a field."""
    depth = data.draw(st.sampled_from([MAX_JSON_DEPTH + 1, 1000, 100_000]))
    opener, closer = data.draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    nested = opener * depth + ("" if data.draw(st.booleans()) else "0" + closer * depth)
    if data.draw(st.booleans()):
        return [frames[0], nested.encode(), *frames[2:]]
    header = frames[1].decode()
    return [frames[0], (header[:-1] + ', "deep": ' + nested + "}").encode(), *frames[2:]]


MUTATIONS = [
    hostile_field,
    absurd_sizes,
    retyped_buffers,
    deep_json,
    flip_bits,
    cut,
    drop_or_repeat_frames,
    garbage_buffers,
]


def mutant(data, original: list[bytes]) -> list[bytes]:
    mutation = data.draw(st.sampled_from(MUTATIONS))
    event(mutation.__name__)
    return mutation(data, [bytes(f) for f in original])
