"""Coverage-guided fuzzing of a pin's own server code, in process, with libFuzzer.

* ``rpc_server_fuzzer.cpp`` -- the C++ target: the pin's ggml-rpc.cpp compiled into it, one
  input = one client connection fed to the server's per-connection function with the real CPU
  backend, handles and bases relocated like the live harness does;
* ``build.sh`` -- OSS-Fuzz style build ($CC $CXX $CFLAGS $CXXFLAGS $LIB_FUZZING_ENGINE $SRC
  $OUT); ``replay_main.c`` -- the engine of coverage builds; ``*.dict`` -- the dictionary;
* :mod:`.build` -- clang-16 builds of a pin into the peer cache; :mod:`.corpus` -- seeds from
  the structured generator, inputs <-> cases; :mod:`.engine` -- ``harness fuzz --engine
  libfuzzer``.
"""
