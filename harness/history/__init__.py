"""History across runs: the append-only store (:mod:`.store`) and what files a report folder
into it (:mod:`.ingest`)."""
