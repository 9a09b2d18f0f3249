"""`tensorplan serve`: an OpenAI-compatible transcription server over one shared model.

Layers, each a module with one job: `uploads` streams a multipart body into a bounded temp
file, `params` turns its fields into TranscribeOptions, `pool` runs jobs on N sessions behind a
bounded queue, `responses` and `streaming` render results, `app` holds the routes, `server` runs
uvicorn and stops it cleanly. The server sees sessions only, never kernels or buffers: it
imports tensorplan.whisper's public API and nothing below it (tests/test_static.py checks).
"""
