"""``harness pr``: a llama.cpp pull request's build held to the version rule.

The build (its checkout built as a peer, or a peer already built) plays "new" against the
released pins (the releases design, judged by the version rule) and against the reference
peer of the version it announces (every scenario, each side's label checked on the wire), and
a short differential runs it against that reference. A build that changes what crosses the
wire without changing the version it announces breaks compatibility without a bump and fails;
so does one that breaks the version rule itself. The job summary (Markdown), the annotations
and the report folder are what the GitHub Action (``action.yml``) shows of it.
"""
