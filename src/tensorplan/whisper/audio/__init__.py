"""Audio in: file decoding, the log-mel features, voice activity and cutting at pauses.

May import the errors/files leaves, backends.threads (VAD's pool), and of whisper only
result and tokenizer; `audio.constants` (the one home of SAMPLE_RATE, HOP_LENGTH, N_FRAMES,
...) may be imported by every module."""
