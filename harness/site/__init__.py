"""The results site: a static site with history (:mod:`.build`), its pages (:mod:`.pages`)
and its link check (:mod:`.links`)."""
