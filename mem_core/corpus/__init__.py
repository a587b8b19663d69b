"""The corpus: a directory of HDF5 event shards plus a JSON manifest, written while recording and read for training.

``format`` describes the layout and the crash-safety rules, ``writer`` holds ``CorpusWriter`` (with ``folder``: the
folder and its writer lock, ``journal``: manifest commits, ``space``: disk room and ballast), ``reader`` ``Corpus``,
``shard`` a shard opened for reading, ``snapshot`` ``snapshot_corpus`` (the recordings of one moment, sharing the
shards).
"""

from mem_core.corpus.folder import prepare_corpus_dir
from mem_core.corpus.format import MANIFEST, MIN_PER_CLASS, CorpusError, CorpusFullError, RecordingInfo, labels_problem
from mem_core.corpus.reader import Corpus
from mem_core.corpus.snapshot import SNAPSHOT_OF, snapshot_corpus
from mem_core.corpus.writer import CorpusWriter

__all__ = [
    "MANIFEST",
    "MIN_PER_CLASS",
    "SNAPSHOT_OF",
    "Corpus",
    "CorpusError",
    "CorpusFullError",
    "CorpusWriter",
    "RecordingInfo",
    "labels_problem",
    "prepare_corpus_dir",
    "snapshot_corpus",
]
