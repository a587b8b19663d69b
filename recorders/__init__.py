"""Getting events in: live sources, recording them into corpora, publishing them, ingesting files.

Every live source implements ``base.LiveSource`` (``replay``, ``simulated``, ``synthetic``, ``camera``,
``zmq_source``) and ``sources.open_source(spec)`` builds one from a CLI string. ``record`` streams a source into a
corpus (``live_recorder`` does the same from inside ``mem serve``), ``publish`` sends batches over ZMQ, ``ingest``
turns files into a corpus. ``config`` holds the dataclasses of ``mem record`` and ``mem ingest``.
"""
