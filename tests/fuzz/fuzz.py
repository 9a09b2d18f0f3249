"""atheris driver: `python tests/fuzz/fuzz.py HARNESS [libFuzzer flags] [corpus dirs]`.

HARNESS is one of harnesses.HARNESSES (model_bin, tokenizer, trace, audio). tensorplan is
instrumented for coverage; numpy, PyAV (ffmpeg) and tokenizers run uninstrumented. Examples:

    python tests/fuzz/fuzz.py trace -max_total_time=60 /tmp/new tests/fuzz/corpus/trace
    python tests/fuzz/fuzz.py audio crash-1234   # replay one input

libFuzzer adds new inputs to the first corpus directory: give it a scratch one.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["tensorplan"]):
    import harnesses


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in harnesses.HARNESSES:
        sys.exit(f"usage: fuzz.py {{{','.join(harnesses.HARNESSES)}}} [libFuzzer args]")
    target = harnesses.HARNESSES[sys.argv.pop(1)]

    def one_input(data: bytes) -> None:
        harnesses.run(target, data)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
