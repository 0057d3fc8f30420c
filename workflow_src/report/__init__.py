"""Report pieces: HTML tables, matplotlib plots, captions."""
