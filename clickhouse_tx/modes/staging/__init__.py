"""Mode ``staging``: the mode (:mod:`.mode`), its stage tables and their sessions (:mod:`.tables`),
and stages published together in one step (:mod:`.publish`)."""
