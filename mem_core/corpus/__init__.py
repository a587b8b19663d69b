"""The corpus: a directory of HDF5 event shards plus a JSON manifest, written while recording and read for training.

``format`` describes the layout and the crash-safety rules, ``writer`` holds ``CorpusWriter``, ``reader`` ``Corpus``.
"""

from mem_core.corpus.format import MANIFEST, CorpusError, CorpusFullError, RecordingInfo
from mem_core.corpus.reader import Corpus
from mem_core.corpus.writer import CorpusWriter

__all__ = [
    "MANIFEST",
    "Corpus",
    "CorpusError",
    "CorpusFullError",
    "CorpusWriter",
    "RecordingInfo",
]
