"""The MEM application: the ``mem`` command line, the live inference server and the Qt viewer."""
