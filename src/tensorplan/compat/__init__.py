"""Drop-in APIs of other Whisper libraries over tensorplan's engine.

`tensorplan.compat.faster_whisper` speaks faster-whisper's Python API (`WhisperModel`,
`BatchedInferencePipeline`, `decode_audio`): switching is one import line (docs/compat.md).
"""
