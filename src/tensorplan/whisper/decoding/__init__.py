"""Decoding: one window into tokens, long audio window after window (the seek loop),
word timings, and batches of windows decoded in lockstep.

May import, of whisper, `planned` (sessions), `audio`, `model_files` (types), the options,
results and tokenizer; never the API, and never the runtime below the backend protocol
(the `machine` leaf aside: batched windows encode in two lanes that share the cores)."""
