"""Mode ``dedup``: the mode (:mod:`.mode`), how rows are cut into named chunks (:mod:`.chunks`),
the deduplication window a replay relies on (:mod:`.window`), and the batch layout records that
refuse a replay cut otherwise (:mod:`.claims`, :mod:`.replay_guard`, :mod:`.records`, :mod:`.lifetime`)."""
