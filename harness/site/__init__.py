"""The results site: a static site with history (:mod:`.build`), its pages (:mod:`.pages`),
the cell pages with their evidence inline and the decoded transcript pages (:mod:`.cells`),
and its link check (:mod:`.links`)."""
