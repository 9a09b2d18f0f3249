"""Whisper's audio constants, defined once: every module imports them from here, as
openai-whisper's modules import them from its audio.py."""

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms analysis window
HOP_LENGTH = 160  # 10 ms between frames
CHUNK_LENGTH = 30  # seconds per model window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 frames in a mel window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 frames (10 ms each) per second
INPUT_STRIDE = 2  # mel frames per encoder position (conv2's stride): one timestamp step
TIME_PRECISION = INPUT_STRIDE / FRAMES_PER_SECOND  # 0.02 s per timestamp token
