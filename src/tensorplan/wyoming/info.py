"""The `info` event: one ASR program, tensorplan, with the model this server loaded."""

from __future__ import annotations

from wyoming.info import AsrModel, AsrProgram, Attribution, Info

from tensorplan import __version__
from tensorplan.whisper.api import Whisper
from tensorplan.whisper.tokenizer import LANGUAGES

ATTRIBUTION = Attribution(name="OpenAI", url="https://github.com/openai/whisper")


def languages(whisper: Whisper) -> list[str]:
    return list(LANGUAGES) if whisper.is_multilingual else ["en"]


def describe(whisper: Whisper, model_name: str) -> Info:
    model = AsrModel(name=model_name, attribution=ATTRIBUTION, installed=True,
                     description=f"Whisper {model_name} on tensorplan", version=__version__,
                     languages=languages(whisper))
    program = AsrProgram(name="tensorplan", attribution=Attribution(
        name="tensorplan", url="https://pypi.org/project/tensorplan/"), installed=True,
        description="Whisper speech to text on a tensor-graph runtime with a static memory "
                    "planner", version=__version__, models=[model],
        supports_transcript_streaming=True)
    return Info(asr=[program])
