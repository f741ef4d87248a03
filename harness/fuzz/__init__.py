"""Fuzzing ggml-rpc peers: generation, campaigns, minimisation, replay.

    harness fuzz --target p7 --duration 10m [--workers K] [--seed N] [--out reports/fuzz-x]
    harness fuzz --target ref-7.0.0 --duration 10m        # the reference server: must be clean
    harness fuzz --target client:p7 --duration 2m         # the real client vs a lying server
    harness replay reports/fuzz-x/crashes/<id>/repro.rpct --target p7   # exit 1 = reproduced
    harness fuzz --target p7 --shard 2/4 --out shard2 ...; harness fuzz-merge --out all shard*
    harness fuzz --differential p7 ref-7.0.0 --duration 2m [--allow intended.yaml]

Modules, in the order data flows:

* :mod:`harness.strategies` -- valid messages and structured mutations (the mutation
  registry); :mod:`.generate` -- whole connections from a session model, mutations mixed in;
* :mod:`.case` -- steps, sentinel handles/bases and their relocation, spec expectations;
* :mod:`.execute` -- one connection, pipelined or lockstep, with the connection oracle;
* :mod:`.target_spec` -- ``--target`` parsed; :mod:`.target` / :mod:`.case_runner` -- launching
  targets, deaths, hangs, memory, attribution; :mod:`.signature` -- what names a finding;
* :mod:`.campaign` -- workers, hypothesis rounds, dedupe, shards; :mod:`.evolve` -- the
  evolving corpus (new-behaviour entries, mutated with a plain PRNG); :mod:`.shrink` -- ddmin
  and reproducer folders; :mod:`.replay`; :mod:`.report`; :mod:`.merge` -- shard folders into
  one campaign; :mod:`.differential` -- two servers, the same sessions, every divergence
  (:mod:`.divergence` compares two runs, :mod:`.allow_list` the differences that are not bugs,
  :mod:`.differential_report` its report.md);
  :mod:`.client` -- client targets;
* :mod:`.throughput` -- messages/s through one connection (for ``harness bench``).
"""
