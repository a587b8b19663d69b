"""Model files: load a trained model from a run or an export directory, and export it for the live server.

An export directory holds ``model.safetensors`` + ``model.json`` (format version, task, architecture, classes,
input spec, head width, the window the model was trained on) and, when the model was pretrained with MEM,
``tokenizer.safetensors`` + ``tokenizer.json`` for the live token overlay. Safetensors and JSON only: nothing in an
export is executed. A JSON file of another format version than ``EXPORT_VERSION`` is refused, naming both.

``load_model`` takes an export directory or a finetune / segment run directory (the run's best checkpoint);
``load_tokenizer`` a tokenizer run or an export directory that carries one.

Loading trusts nothing in the files: the JSON is read only up to ``MAX_JSON_BYTES`` and checked against a schema
(``ModelMeta``, ``mem_core.schema``; the architecture and input as a training config's, ``mem_core.train.configs``),
the architecture is first built on PyTorch's "meta" device (no memory), and the weights file must hold exactly the
tensors (names, shapes) of that model, so the model that is then built is no larger than its weights file, plus the
buffers it computes itself (relative position indices), which may take at most ``MAX_DERIVED_BYTES``. One window
through that skeleton counts the work the model asks of the live server per window, at most ``MAX_WINDOW_FLOPS``.
Every failure is a ``RunError`` naming the file.

The modules, by job: ``meta`` (the format: version, file names, ``ModelMeta`` and its checks), ``cost`` (a
described model against its weights and its work per window, on the meta device), ``load`` (``load_model``,
``load_tokenizer``), ``write`` (``export_model``, ``export_run``, ``export_tokenizer``), ``untrained``
(``export_random``: a model of random weights for benchmarks and tests). Import from ``mem_core.runs.export``.
"""

from mem_core.runs.export.cost import window_flops
from mem_core.runs.export.load import load_model, load_tokenizer
from mem_core.runs.export.meta import (
    EXPORT_VERSION,
    MODEL_FILE,
    TASKS,
    TOKENIZER_FILE,
    TOKENIZER_JSON,
    ModelMeta,
    TrainingWindow,
    build_task_model,
    check_meta,
    training_window,
)
from mem_core.runs.export.untrained import export_random
from mem_core.runs.export.write import export_model, export_run, export_tokenizer, prepare_export_dir

__all__ = [
    "EXPORT_VERSION",
    "MODEL_FILE",
    "TASKS",
    "TOKENIZER_FILE",
    "TOKENIZER_JSON",
    "ModelMeta",
    "TrainingWindow",
    "build_task_model",
    "check_meta",
    "export_model",
    "export_random",
    "export_run",
    "export_tokenizer",
    "load_model",
    "load_tokenizer",
    "prepare_export_dir",
    "training_window",
    "window_flops",
]
