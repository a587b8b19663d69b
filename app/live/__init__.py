"""The live inference server (``mem serve``): sources -> ring of newest events -> model -> ZMQ publisher."""
