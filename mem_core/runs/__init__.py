"""What training leaves behind and the live path reads: run directories (``rundir``), the links between runs
(``lineage``) and exported models (``export``). Below both training and inference: nothing here imports
``mem_core.train``. Empty on purpose, so that ``lineage`` is read without importing torch."""
