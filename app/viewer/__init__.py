"""The Qt live viewer (``mem view``): draws what the live server publishes; never imports torch."""
